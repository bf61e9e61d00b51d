"""Stage 5a: the evaluator's reward for its rubric, and what enters the consistency C(Gamma).

``evaluator.reward`` names an :class:`EvaluatorReward` in ``step.objectives.EVALUATOR_REWARDS``: the signal REINFORCE
follows. The core's three (a plug-in registers more, e.g. ``methods/preference``; docs/EXTENDING.md):

* ``consistency`` (SCORE): R = mean over queries of C_i, the mean pairwise TF-IDF cosine of the
  conclusions of the query's *valid* reports. A query with fewer than two valid reports has no C_i;
  a step in which no query has one gives no evaluator update (and leaves the baseline alone).
* ``discriminative`` (EvoRubrics' self-supervised variant): R = mean over queries of the std of the
  rubric-weighted scores of the query's *valid* reports (a(r) > 0; queries with fewer than two have no
  value), so a rubric is rewarded for keeping the solver's usable reports apart as the solver improves,
  not for separating them from empty or broken ones, which a(r) already zeroes.
* ``solver_reward`` (the paper's "without consistency reward" ablation): R = the mean solver reward
  R_s under the rubric, the directly exploitable signal consistency replaces.

An invalid rubric (the solver used the harness fallback) is rewarded ``invalid_rubric_reward``.

**Only judged reports count.** A report no complete evaluation scored (``StepRewards.judged``: an external judge's
failed judgement, an evaluation cut before it) has no scores: its row of zeros is a failure, not a score, so the
discriminative spreads and the ``solver_reward`` means are taken over the judged reports only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from score_lightning import distributed as D
from score_lightning.rewards.functions import consistency_over_valid
from score_lightning.roles.answer import AnswerParse, extract_conclusion
from score_lightning.step.scalars import StepScalars


@dataclass(frozen=True)
class RewardInputs:
    """What an evaluator reward reads: this rank's reports (query-major, rows of ``num_reports``) and the values
    already pooled over ranks."""

    answers: Sequence[AnswerParse]
    rubric_part: Tensor  # per report: sum_j w_j s_j under the step's rubric
    rewards: Tensor  # per report: the solver reward R_s
    judged: Sequence[bool]  # per report: a complete evaluation scored it
    num_reports: int
    consistency: float  # C(Gamma) pooled over ranks (NaN: no query had two valid reports)
    measured: float | None = None  # what an objective measured for the step's rubric (``EvaluatorObjective.measure``)


@dataclass(frozen=True)
class EvaluatorReward:
    """One ``evaluator.reward``: the value of a rubric written for the whole global batch, and of a query's own rubric.

    ``batch_value`` is collective (every rank calls it, in the same order; it may pool a logged scalar); NaN means
    no signal. ``query_values`` is this rank's value per query (``None``: undefined), pure; ``None`` in its place
    means a query's rubric earns the batch value too. ``objective`` builds, from the config, what else this reward
    samples, measures or trains (``step.evaluator_objective.EvaluatorObjective``)."""

    batch_value: Callable[[RewardInputs, StepScalars], float]
    query_values: Callable[[RewardInputs], list[float | None]] | None = None
    objective: Callable[..., object] | None = None


def valid_conclusion_groups(answers: Sequence[AnswerParse], num_reports: int) -> list[list[str]]:
    """Per query, the conclusions of its valid reports; only groups with at least two of them."""
    groups = []
    for start in range(0, len(answers), num_reports):
        kept = [extract_conclusion(a.answer) for a in answers[start:start + num_reports] if a.valid and a.answer]
        if len(kept) >= 2:
            groups.append(kept)
    return groups


def group_spreads(rubric_part: Tensor, valid: Sequence[bool], num_reports: int) -> list[float | None]:
    """Per query: the population std of its valid reports' rubric-weighted scores (the discriminative reward);
    ``None`` for a query with fewer than two valid reports."""
    out: list[float | None] = []
    for row, ok in zip(rubric_part.view(-1, num_reports).float(), [valid[i:i + num_reports]
                                                                  for i in range(0, len(valid), num_reports)]):
        kept = row[[bool(v) for v in ok]]
        out.append(kept.std(unbiased=False).item() if kept.numel() >= 2 else None)
    return out


def judged_reports(rw) -> list[bool]:
    """Per report: a complete evaluation scored it (every report when the step has no such record)."""
    return [bool(j) for j in (getattr(rw, "judged", None) or [True] * len(rw.answers))]


def spread_mask(answers: Sequence[AnswerParse], judged: Sequence[bool] | None = None) -> list[bool]:
    """The reports a discriminative spread reads: valid (a(r) > 0, an answer) and judged."""
    judged = judged if judged is not None else [True] * len(answers)
    return [bool(a.valid and a.answer and j) for a, j in zip(answers, judged)]


def judged_reward_means(rewards: Tensor, judged: Sequence[bool], num_reports: int) -> list[float | None]:
    """Per query: the mean solver reward of its judged reports (``None``: none was judged)."""
    out: list[float | None] = []
    for row, ok in zip(rewards.view(-1, num_reports).float(), torch.tensor(list(judged)).view(-1, num_reports)):
        out.append(row[ok].mean().item() if bool(ok.any()) else None)
    return out


def query_consistencies(answers: Sequence[AnswerParse], num_reports: int) -> list[float | None]:
    """Per query: C_i over its valid reports' conclusions (``None``: fewer than two)."""
    out = []
    for start in range(0, len(answers), num_reports):
        group = answers[start:start + num_reports]
        out.append(consistency_over_valid([extract_conclusion(a.answer or "") for a in group],
                                          [bool(a.valid and a.answer) for a in group]))
    return out


def rubric_reward(rubric_valid: bool, value: float | None, invalid_rubric_reward: float) -> float | None:
    """A rubric's R_eval from its reward's value (NaN: undefined), or ``None`` when there is no signal."""
    if not rubric_valid:
        return float(invalid_rubric_reward)
    return None if value is None or math.isnan(value) else float(value)


def _discriminative_batch(inputs: RewardInputs, scalars: StepScalars) -> float:
    """The spreads pooled over every rank's queries, logged as ``evaluator/discriminative``."""
    scalars.mean("evaluator/discriminative", 0.0, 0)  # every rank creates the tag, even with no valid group to spread
    for spread in group_spreads(inputs.rubric_part, spread_mask(inputs.answers, inputs.judged), inputs.num_reports):
        if spread is not None:  # a query with fewer than two valid, judged reports has no spread to reward
            scalars.mean("evaluator/discriminative", spread, 1)
    return scalars.global_value("evaluator/discriminative")


def _solver_reward_batch(inputs: RewardInputs, scalars: StepScalars) -> float:
    """The mean reward of the judged reports, pooled over ranks."""
    kept = inputs.rewards[torch.tensor(list(inputs.judged), dtype=torch.bool)]
    total, count = D.global_sum(float(kept.sum())), D.global_sum(int(kept.numel()))
    return total / count if count else math.nan


CONSISTENCY = EvaluatorReward(lambda inputs, scalars: inputs.consistency,
                              lambda inputs: query_consistencies(inputs.answers, inputs.num_reports))
DISCRIMINATIVE = EvaluatorReward(_discriminative_batch, lambda inputs: group_spreads(
    inputs.rubric_part, spread_mask(inputs.answers, inputs.judged), inputs.num_reports))
SOLVER_REWARD = EvaluatorReward(_solver_reward_batch, lambda inputs: judged_reward_means(
    inputs.rewards, inputs.judged, inputs.num_reports))
