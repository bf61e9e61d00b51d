"""The evaluator's signal as registered plug-ins: ``evaluator.reward`` and ``reward.step``, and the step's objectives.

Why registries: the step must name no method, yet ``evaluator.reward=preference`` or ``reward.step=rubric`` has to
reach that method's code. The core registers its own entries here; a method registers its entries in its package
under :mod:`score_lightning.methods` (docs/EXTENDING.md, "Evaluator objectives and step credit").

* :data:`EVALUATOR_REWARDS` (``evaluator.reward``): an :class:`~score_lightning.step.evaluator_reward.EvaluatorReward`,
  the value each rubric sample earns (consistency, discriminative and solver_reward here);
* :data:`STEP_CREDIT` (``reward.step``): a factory ``cfg -> EvaluatorObjective`` for the credit a solver's steps
  get (``none`` here: no credit).

The step builds its objectives once (:func:`build_objectives`) and folds them in that order (:func:`fold_objectives`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from score_lightning.registry import Registry
from score_lightning.step import evaluator_reward as ER
from score_lightning.step.evaluator_objective import EvaluatorObjective
from score_lightning.step.scoring_reward import scoring_reward_stage

#: ``evaluator.reward``: what REINFORCE follows for the step's rubrics
EVALUATOR_REWARDS: Registry[ER.EvaluatorReward] = Registry("evaluator.reward")
#: ``reward.step``: builds the objective that credits the solver's steps (``cfg -> EvaluatorObjective``)
STEP_CREDIT: Registry[Callable[..., EvaluatorObjective]] = Registry("reward.step")

EVALUATOR_REWARDS.register("consistency", ER.CONSISTENCY)
EVALUATOR_REWARDS.register("discriminative", ER.DISCRIMINATIVE)
EVALUATOR_REWARDS.register("solver_reward", ER.SOLVER_REWARD)
STEP_CREDIT.register("none", lambda cfg: EvaluatorObjective())


def build_objectives(cfg, reward: ER.EvaluatorReward) -> list[EvaluatorObjective]:
    """The step's objectives, in the order the step calls and folds them: the step credit (``reward.step``), the
    scoring tokens' reward (``evaluator.scoring_reward``), then ``reward``'s own objective, if it has one."""
    own = [reward.objective(cfg)] if reward.objective is not None else []
    return [STEP_CREDIT.get(str(cfg.reward.step))(cfg), scoring_reward_stage(cfg.evaluator, cfg.reward), *own]


def fold_objectives(objectives: Sequence[EvaluatorObjective], rubric_rows: list | None,
                    advantages: list[float]) -> tuple[list | None, list[float]]:
    """The evaluator update's rows and advantages: the step's rubric samples (``None``: they do not train), then each
    objective's part, in order. ``None`` rows: no update (the same on every rank)."""
    trained = rubric_rows
    for objective in objectives:
        trained, advantages = objective.fold(trained, advantages)
    return trained, advantages


def trains_step_rubric(objectives: Sequence[EvaluatorObjective]) -> bool:
    """Whether the step's own rubric samples may train with these objectives on."""
    return all(objective.trains_step_rubric for objective in objectives)


def measured_value(values: Sequence[float | None]) -> float | None:
    """The value an objective measured for the step's rubric (the first one; ``None``: none did)."""
    return next((v for v in values if v is not None), None)
