"""Solver workflows (``solver.agent``): how the K solver trajectories of each query are rolled out.

Why a registry: the step, the cold-start probe, the pair scorer and ``evaluate generate`` roll a run's own workflow
out without naming one. ``react`` (one ReAct loop) is the core's and registers below; a method adds another by
registering a :class:`SolverWorkflow` under its ``solver.agent`` value in its package under
:mod:`score_lightning.methods` (``mams``, ``rubricem``). :func:`messages_rollouts` is the ReAct loop over any
per-query prompt, for a workflow that only changes the prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from score_lightning.harness.state import HarnessState
from score_lightning.retrieval.base import Retriever
from score_lightning.roles.prompts import solver_messages
from score_lightning.roles.rubric import Rubric
from score_lightning.registry import Registry
from score_lightning.rollout.agent import AgentConfig, run_agent
from score_lightning.rollout.chat import encode_chat
from score_lightning.rollout.engine import RolloutEngine
from score_lightning.rollout.trajectory import Trajectory

if TYPE_CHECKING:
    from score_lightning.config.schema import SolverConfig


class WorkflowSettings(Protocol):
    """What a workflow reads of the caller's settings (the step's ``RolloutSettings`` has these fields)."""

    num_rollouts: int  # K trajectories per query, query-major
    max_prompt_tokens: int | None  # the solver prompt's cap (None: uncapped, as ``evaluate generate`` encodes)
    solver: AgentConfig  # the solver's budgets and sampling (solver.*)
    conclusion_line: bool  # solver.conclusion_line


@dataclass(frozen=True)
class SolverLoop:
    """:class:`WorkflowSettings` for a caller without the step's settings (``evaluate generate``)."""

    num_rollouts: int
    max_prompt_tokens: int | None
    solver: AgentConfig
    conclusion_line: bool = True


class Rollouts(Protocol):
    def __call__(self, engine: RolloutEngine, tokenizer, retriever: Retriever | None, queries: Sequence[str],
                 rubrics: Sequence[Rubric], state: HarnessState, settings: WorkflowSettings, options: Any,
                 guidance: Sequence[str] | None, metas: Sequence[dict]) -> list[Trajectory]:
        """``settings.num_rollouts`` trajectories per query (query-major), trajectory ``j`` carrying ``metas[j]``."""
        ...


def no_options(_node: Any) -> None:
    """A workflow with no budgets of its own."""
    return None


def solver_response_tokens(solver: "SolverConfig") -> int:
    """``solver.max_response_tokens``: one trajectory is one response under that cap."""
    return int(solver.max_response_tokens)


@dataclass(frozen=True)
class SolverWorkflow:
    """One ``solver.agent`` value: its rollouts, and what the core needs to know of its budgets."""

    rollouts: Rollouts
    #: the run's ``solver`` node (a workflow's own keys live under it: ``solver.mams``) -> the workflow's own
    #: budgets object, handed back to ``rollouts`` as ``options``
    options_from_solver: Callable[["SolverConfig"], Any] = no_options
    #: an evaluation's flat settings (``GenerateConfig.settings()``: ``solver.max_tool_calls``, ``solver.mams`` ...)
    #: -> the same options object, for ``evaluate generate``
    options_from_settings: Callable[[Mapping[str, Any]], Any] = no_options
    #: the run's ``solver`` node -> the most response tokens one trajectory holds (Dr. GRPO's constant,
    #: ``loss_type=dr_grpo``)
    trajectory_tokens: Callable[["SolverConfig"], int] = solver_response_tokens


SOLVER_WORKFLOWS: Registry[SolverWorkflow] = Registry("solver.agent")


def rollout_metas(num_queries: int, k: int) -> list[dict]:
    """``{"query_index", "k"}`` per trajectory, query-major: the step's layout."""
    return [{"query_index": i, "k": j} for i in range(num_queries) for j in range(k)]


def messages_rollouts(engine: RolloutEngine, tokenizer, retriever: Retriever | None, messages: Sequence[list[dict]],
                      settings: WorkflowSettings, metas: Sequence[dict]) -> list[Trajectory]:
    """The ReAct loop from one chat per query, each encoded once and rolled out ``settings.num_rollouts`` times."""
    prompts = []
    for msgs in messages:
        ids = encode_chat(tokenizer, msgs, settings.max_prompt_tokens)
        prompts.extend(ids for _ in range(settings.num_rollouts))
    return run_agent(engine, tokenizer, prompts, retriever, settings.solver, metas)


def react_rollouts(engine: RolloutEngine, tokenizer, retriever: Retriever | None, queries: Sequence[str],
                   rubrics: Sequence[Rubric], state: HarnessState, settings: WorkflowSettings, options: Any,
                   guidance: Sequence[str] | None, metas: Sequence[dict]) -> list[Trajectory]:
    """``solver.agent=react``: the solver prompt (query, rubric, budget), one ReAct loop per trajectory."""
    messages = [solver_messages(q, r, state, settings.solver.max_tool_calls, settings.conclusion_line)
                for q, r in zip(queries, rubrics)]
    return messages_rollouts(engine, tokenizer, retriever, messages, settings, metas)


SOLVER_WORKFLOWS.register("react", SolverWorkflow(react_rollouts))
