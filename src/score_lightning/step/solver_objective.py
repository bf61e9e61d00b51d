"""Phase 1 as a registered plug-in: ``solver.objective`` names how the solver learns from the step's scored groups.

Why a registry: the step must name no method, yet a relative of SCORE may train the solver on the same rollouts and
rewards with another objective (a preference loss instead of group advantages). The step hands one
:class:`SolverInputs` to the objective the config names and logs what it returns; the core registers ``grpo``
(:func:`~score_lightning.step.solver_update.solver_update`, unchanged), and a method registers its own entry in its
package under :mod:`score_lightning.methods` (docs/EXTENDING.md, "Solver objectives").

An entry is a :class:`SolverObjectiveEntry`: ``build(cfg) -> SolverObjective`` once per run, and ``check(cfg) ->
list[str]``, the objective's own config errors (each naming its key), which the config validation reports with the
rest before any model loads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from torch import Tensor, nn

from score_lightning.registry import Registry
from score_lightning.rollout.trajectory import Trajectory
from score_lightning.step.record import record_solver_update
from score_lightning.step.scalars import StepScalars
from score_lightning.step.solver_rows import TokenBonus
from score_lightning.step.rollout_correction import rollout_correction
from score_lightning.step.solver_update import (GRPOSettings, OptimizerHooks, SolverUpdateResult, grpo_settings,
                                                solver_update)


@dataclass
class SolverInputs:
    """What Phase 1 hands the solver's objective: one argument, so a new objective needs no new parameter.

    Tensors are per trajectory of this rank (query-major, ``K`` per query), on the CPU.
    """

    policy: nn.Module  # the solver (the shared actor): trains
    ref: nn.Module | None  # the frozen reference the run keeps (None: loss.kl_coef = 0 loads none)
    trajectories: Sequence[Trajectory]
    rewards: Tensor  # [N] the solver rewards R
    judged: Tensor  # [N] bool: a complete evaluation scored the report (``StepRewards.scored``)
    neutral: Tensor | None  # [N] bool: evaluator.on_incomplete=neutral's groups (advantage 0), or None
    exclude: Tensor | None  # [N] bool: reports that leave the update (on_incomplete=drop), or None
    step_bonus: Sequence[Sequence[TokenBonus]] | None  # the evaluator objectives' token bonuses per trajectory
    pad_id: int
    hooks: OptimizerHooks  # backward, and one optimiser step (clip, finite check, step); collective under DDP
    need_trainer_logprobs: bool  # log the engine-trainer gap: keep the pre-update log-probs


class SolverObjective:
    """How Phase 1 trains the solver. Called on every rank in the same order (``update`` is collective)."""

    def update(self, inputs: SolverInputs) -> SolverUpdateResult:
        """Train the solver on this step's rollouts; this rank's sums (the caller pools them in ``record``)."""
        raise NotImplementedError

    def record(self, scalars: StepScalars, result: SolverUpdateResult) -> dict[str, float]:
        """Feed the rank-local sums into ``scalars`` (pooled over ranks); return values already global."""
        return {"solver/grad_norm": float(np.mean(result.grad_norms)) if result.grad_norms else 0.0,
                "solver/updates": float(result.updates)}


def no_config_errors(cfg) -> list[str]:
    """An objective whose keys the core's own checks cover."""
    return []


@dataclass(frozen=True)
class SolverObjectiveEntry:
    """A registered ``solver.objective``: how to build it from the run config, and its config errors."""

    build: Callable[..., SolverObjective]  # cfg -> SolverObjective
    check: Callable[..., list[str]] = no_config_errors  # cfg -> error lines, each naming its key and the fix


#: ``solver.objective``: how Phase 1 trains the solver
SOLVER_OBJECTIVES: Registry[SolverObjectiveEntry] = Registry("solver.objective")


class GRPOObjective(SolverObjective):
    """SCORE's Phase 1: group-normalised advantages and ``optim.loss_type``'s clipped surrogate with the KL."""

    def __init__(self, settings: GRPOSettings):
        self.settings = settings

    def update(self, inputs: SolverInputs) -> SolverUpdateResult:
        x = inputs
        return solver_update(x.policy, x.ref, x.trajectories, x.rewards, self.settings, x.pad_id, x.hooks,
                             need_trainer_logprobs=x.need_trainer_logprobs, step_bonus=x.step_bonus,
                             neutral=x.neutral, exclude=x.exclude)

    def record(self, scalars: StepScalars, result: SolverUpdateResult) -> dict[str, float]:
        # also the engine-trainer gap (rollout/logprob_diff, mismatch_kl, is_*) when it computed pi_old
        record_solver_update(scalars, result, self.settings.correction)
        return super().record(scalars, result)


def build_grpo(cfg) -> GRPOObjective:
    """``solver.objective=grpo`` from the run's ``solver``, ``optim``, ``loss`` and ``reward`` nodes, with the
    engine-trainer correction ``rollout`` resolves."""
    correction = rollout_correction(cfg.optim, cfg.loss, cfg.rollout)
    return GRPOObjective(grpo_settings(cfg.solver, cfg.optim, cfg.loss, cfg.reward, correction))


SOLVER_OBJECTIVES.register("grpo", SolverObjectiveEntry(build_grpo))
