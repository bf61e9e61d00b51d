"""Stage 5: the evaluator phase of a step: each rubric sample's reward, the EMA baseline, REINFORCE.

Every rank runs it in the same order (the reward pooling and the update are collective).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from score_lightning import distributed as D
from score_lightning.rewards.functions import EMABaseline
from score_lightning.step import evaluator_reward as ER
from score_lightning.step.reward_assembly import StepRewards
from score_lightning.step.scalars import StepScalars
from score_lightning.step.types import StepRollouts


@dataclass
class EvaluatorSignal:
    rewards: list[float | None] = field(default_factory=list)  # per rubric sample of this rank
    advantages: list[float] = field(default_factory=list)  # per sample with a reward
    mean_reward: float | None = None  # pooled over ranks: what the baseline follows
    mean_advantage: float | None = None
    consistency: float = math.nan


def sample_rewards(kind: str, ro: StepRollouts, rw: StepRewards, sc: StepScalars, num_reports: int,
                   invalid_reward: float, preference: Callable[[], float] | None = None) -> tuple[list[float | None], float]:
    """Each rubric sample's R_eval under ``evaluator.reward``, and the pooled consistency (always logged).

    The score-based kinds read judged reports only: an unjudged report's row of zeros is no score."""
    sc.consistency.update(ER.valid_conclusion_groups(rw.answers, num_reports))
    judged = ER.judged_reports(rw)
    if kind == "discriminative":
        sc.mean("evaluator/discriminative", 0.0, 0)  # every rank creates the tag, even with no valid group to spread
        for spread in ER.group_spreads(rw.rubric_part, ER.spread_mask(rw.answers, judged), num_reports):
            if spread is not None:  # a query with fewer than two valid, judged reports has no spread to reward
                sc.mean("evaluator/discriminative", spread, 1)
    consistency = sc.global_consistency()
    if kind == "consistency":
        global_value = consistency
    elif kind == "solver_reward":  # the mean reward of the judged reports, pooled over ranks (collective)
        kept = rw.rewards[torch.tensor(judged, dtype=torch.bool)]
        total, count = D.global_sum(float(kept.sum())), D.global_sum(int(kept.numel()))
        global_value = total / count if count else math.nan
    elif kind == "discriminative":
        global_value = sc.global_value("evaluator/discriminative")
    else:
        global_value = preference() if preference is not None else math.nan
    local: list[float | None] | None = None
    out = []
    for sample, queries in ro.rubrics.samples:
        if queries is None:  # one rubric for the whole global batch
            value = global_value
        else:
            if local is None:
                local = ER.per_query_values(kind, rw.answers, rw.rubric_part, rw.rewards, num_reports, judged)
            vals = [local[q] for q in queries if local[q] is not None]
            value = sum(vals) / len(vals) if vals else (global_value if kind == "preference" else math.nan)
        out.append(ER.evaluator_reward(kind, sample.valid, value, invalid_reward))
    return out, consistency


def fold_rows(main: list, main_adv: list[float], extra: list, extra_adv: list[float]) -> tuple[list, list[float]]:
    """One REINFORCE update over several parts (rubric samples, step judgements, scoring or pair rubrics): each part's
    advantages are scaled by N / its size, so the row mean of the loss is the sum of the parts' means."""
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
