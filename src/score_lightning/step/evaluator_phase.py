"""Stage 5: the evaluator phase of a step: each rubric sample's reward, the EMA baseline, REINFORCE.

Every rank runs it in the same order (the reward pooling and the update are collective).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from score_lightning import distributed as D
from score_lightning.rewards.functions import EMABaseline
from score_lightning.step import evaluator_reward as ER
from score_lightning.step.reward_assembly import StepRewards
from score_lightning.step.scalars import StepScalars
from score_lightning.step.types import StepRollouts


@dataclass
class EvaluatorSignal:
    """Phase 2's reading of the step: what REINFORCE follows for the step's rubrics."""

    rewards: list[float | None] = field(default_factory=list)  # per rubric sample of this rank
    advantages: list[float] = field(default_factory=list)  # per sample with a reward
    mean_reward: float | None = None  # pooled over ranks: what the baseline follows
    mean_advantage: float | None = None
    consistency: float = math.nan


def sample_rewards(reward: ER.EvaluatorReward, rollouts: StepRollouts, rewards: StepRewards, scalars: StepScalars,
                   num_reports: int, invalid_reward: float, measured: float | None = None
                   ) -> tuple[list[float | None], float]:
    """Each rubric sample's R_eval under ``reward`` (``evaluator.reward``'s entry), and the pooled consistency (always
    logged). ``measured``: what an objective measured for the step's rubric (``EvaluatorObjective.measure``).

    A rubric for the whole global batch earns the batch value; a query's own rubric the mean of its queries' values
    (NaN when none has one), or the batch value when the reward has no per-query value. Collective."""
    scalars.consistency.update(ER.valid_conclusion_groups(rewards.answers, num_reports))
    inputs = ER.RewardInputs(rewards.answers, rewards.rubric_part, rewards.rewards, ER.judged_reports(rewards),
                             num_reports, scalars.global_consistency(), measured)
    batch = reward.batch_value(inputs, scalars)
    local: list[float | None] | None = None
    out = []
    for sample, queries in rollouts.rubrics.samples:
        value = batch
        if queries is not None and reward.query_values is not None:  # a rubric that belongs to its queries
            if local is None:
                local = reward.query_values(inputs)
            values = [local[q] for q in queries if local[q] is not None]
            value = sum(values) / len(values) if values else math.nan
        out.append(ER.rubric_reward(sample.valid, value, invalid_reward))
    return out, inputs.consistency


def fold_rows(main: list, main_adv: list[float], extra: list, extra_adv: list[float]) -> tuple[list, list[float]]:
    """One REINFORCE update over several parts (rubric samples, and each objective's rows): each part's advantages
    are scaled by N / its size, so the row mean of the loss is the sum of the parts' means."""
    total = len(main) + len(extra)
    scale_m, scale_s = (total / len(main) if main else 1.0), (total / len(extra) if extra else 1.0)
    return list(main) + list(extra), [a * scale_m for a in main_adv] + [a * scale_s for a in extra_adv]


def centre(rewards: list[float | None], baseline: EMABaseline) -> tuple[list[float], float | None, float | None]:
    """Advantages A = R - b_{t-1} for the samples with a reward; the baseline follows their pooled mean.

    Pooled over ranks, so every rank keeps the same baseline (SCORE's single rubric has the same
    reward everywhere; per-query rubrics are averaged over the global batch).
    """
    defined = [r for r in rewards if r is not None]
    total, count = D.global_sum(sum(defined)), D.global_sum(len(defined))
    if count == 0:
        return [], None, None
    b_prev = baseline.value
    mean = total / count
    baseline.update(mean)
    return [r - b_prev for r in defined], mean, mean - b_prev
