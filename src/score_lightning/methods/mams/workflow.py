"""``solver.agent=mams`` as a registered solver workflow: MaMs's rollouts, its budgets and its trajectory cap.

The step's K-per-query layout holds: query ``i``'s K runs are rows ``i*K .. i*K+K-1``, one segmented trajectory each.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

from score_lightning.harness.state import HarnessState
from score_lightning.methods.mams.agent import MamsConfig, mams_settings, run_mams
from score_lightning.retrieval.base import Retriever
from score_lightning.roles.prompts import format_rubric
from score_lightning.roles.rubric import Rubric
from score_lightning.rollout.engine import RolloutEngine
from score_lightning.rollout.trajectory import Trajectory
from score_lightning.rollout.workflows import SOLVER_WORKFLOWS, SolverWorkflow, WorkflowSettings


def mams_rollouts(engine: RolloutEngine, tokenizer, retriever: Retriever | None, queries: Sequence[str],
                  rubrics: Sequence[Rubric], state: HarnessState, settings: WorkflowSettings, options: MamsConfig,
                  guidance: Sequence[str] | None, metas: Sequence[dict]) -> list[Trajectory]:
    """K MaMs runs per query under its rubric's text (MaMs has no reflection memory: ``guidance`` is unused)."""
    k = settings.num_rollouts
    return run_mams(engine, tokenizer, [q for q in queries for _ in range(k)],
                    [format_rubric(r, state) for r in rubrics for _ in range(k)], retriever, options, metas)


def mams_from_settings(settings: Mapping[str, Any]) -> MamsConfig:
    """MaMs's budgets for ``evaluate generate``: the run's ``solver.mams`` over the class defaults (unknown keys
    ignored), the search budget and sampling from the solver's settings."""
    known = {f.name for f in fields(MamsConfig)}
    budgets = {k: int(v) for k, v in (settings.get("solver.mams") or {}).items() if k in known}  # data, not config
    return MamsConfig(**{**budgets, "max_searches": int(settings["solver.max_tool_calls"]),
                         "topk": int(settings["solver.topk"]), "temperature": float(settings["solver.temperature"]),
                         "top_p": float(settings["solver.top_p"]),
                         "conclusion_line": bool(settings["solver.conclusion_line"])})


SOLVER_WORKFLOWS.register("mams", SolverWorkflow(
    mams_rollouts, options_from_solver=mams_settings, options_from_settings=mams_from_settings,
    trajectory_tokens=lambda solver: mams_settings(solver).max_response_tokens))
