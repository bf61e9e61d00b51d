"""What an evaluator objective is: one part of the evaluator's training signal besides its rubric's reward.

Why a type: the step folds a plain list of objectives (``step.objectives.build_objectives``), so it names no method.
Step credit (``reward.step``), the scoring tokens' reward (``evaluator.scoring_reward``) and a reward's own work
(``evaluator.reward``'s ``EvaluatorReward.objective``) are objectives. Each hook is called on every rank in the
order of the list, at its line of Algorithm 1:

1. ``judge`` after the scoring, before the solver's update: may return token bonuses for the solver's advantage and
   log scalars (collective when on: it may generate and pool a baseline);
2. ``measure`` in Phase 2, after the solver's update: may sample and score with the updated evaluator and return the
   value the step's rubric earns (``RewardInputs.measured``);
3. ``fold`` joins its rows to the evaluator's one REINFORCE update, each part keeping its own mean
   (``evaluator_phase.fold_rows``); ``trains_step_rubric`` false leaves the step's rubric samples out of it;
4. ``scalars`` are values already global, logged as they are; ``state_dict`` goes into the checkpoint.

This base class does nothing at every hook, so an objective overrides only what it needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from score_lightning.step.reward_assembly import StepRewards
from score_lightning.step.scalars import StepScalars
from score_lightning.step.solver_rows import TokenBonus
from score_lightning.step.types import StepRollouts

#: per solver trajectory, the token bonuses added to its advantage (``solver_update``'s ``step_bonus``)
Bonuses = list[list[TokenBonus]]


class ObjectiveHost(Protocol):
    """The trainer's parts an objective may use (``ScoreModule`` has them; a test may pass a namespace)."""

    evaluator_engine: Any
    tokenizer: Any
    retriever: Any
    harness_state: Any
    scheduler: Any
    rollout_settings: Any


@dataclass
class StepView:
    """What an objective reads of one step: one argument, so a new objective needs no new parameter."""

    host: ObjectiveHost
    rollouts: StepRollouts
    rewards: StepRewards
    scalars: StepScalars
    num_reports: int  # K, the reports per query
    step: int  # the SCORE step (``score_step``)


class EvaluatorObjective:
    """An objective that adds nothing (``reward.step=none``); the base of every objective (module docstring)."""

    #: False: while this objective is on, the step's own rubric samples leave the evaluator's update
    trains_step_rubric: bool = True

    def judge(self, step: StepView) -> Bonuses | None:
        """Before the solver's update: token bonuses per trajectory, or ``None``."""
        return None

    def measure(self, step: StepView) -> float | None:
        """Phase 2, after the solver's update: the value the step's rubric earns, or ``None``."""
        return None

    def fold(self, trained: list | None, advantages: list[float]) -> tuple[list | None, list[float]]:
        """The update's rows and advantages with this objective's part joined (``trained`` ``None``: nothing else
        trains)."""
        return trained, advantages

    def scalars(self) -> dict[str, float]:
        """Values already identical on every rank, logged as they are."""
        return {}

    def state_dict(self) -> dict:
        """Splatted into the checkpoint's ``score`` section."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def merged_bonuses(bonuses: list[Bonuses | None]) -> Bonuses | None:
    """Each trajectory's bonuses from every objective that gave some (``None``: none did)."""
    given = [b for b in bonuses if b is not None]
    if len(given) <= 1:
        return given[0] if given else None
    return [[bonus for part in rows for bonus in part] for rows in zip(*given)]
