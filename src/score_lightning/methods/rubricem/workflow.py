"""``solver.agent=rubricem`` as a registered solver workflow: the ReAct loop under RubricEM's four-stage prompt.

Each query's prompt carries its reflection-memory ``guidance`` when the step passes one
(``solver.rubricem.reflection``); ``evaluate generate`` passes none (a held-out query was never judged, so its memory
is empty).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from score_lightning.harness.state import HarnessState
from score_lightning.methods.rubricem.prompts import rubricem_messages
from score_lightning.retrieval.base import Retriever
from score_lightning.roles.rubric import Rubric
from score_lightning.rollout.engine import RolloutEngine
from score_lightning.rollout.trajectory import Trajectory
from score_lightning.rollout.workflows import SOLVER_WORKFLOWS, SolverWorkflow, WorkflowSettings, messages_rollouts


def rubricem_rollouts(engine: RolloutEngine, tokenizer, retriever: Retriever | None, queries: Sequence[str],
                      rubrics: Sequence[Rubric], state: HarnessState, settings: WorkflowSettings, options: Any,
                      guidance: Sequence[str] | None, metas: Sequence[dict]) -> list[Trajectory]:
    """Plan (a self-written rubric), research, review and answer in one ReAct loop per trajectory."""
    messages = [rubricem_messages(q, r, state, settings.solver.max_tool_calls, guidance[i] if guidance else "")
                for i, (q, r) in enumerate(zip(queries, rubrics))]
    return messages_rollouts(engine, tokenizer, retriever, messages, settings, metas)


SOLVER_WORKFLOWS.register("rubricem", SolverWorkflow(rubricem_rollouts))
