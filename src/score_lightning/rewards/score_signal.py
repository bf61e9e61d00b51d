"""Do the evaluator's scores carry signal? The maths of ``scripts/probe_scoring.py`` (pure functions).

Two questions about the rubric-weighted score Σ_j w_j s_j that the reward uses:

* **gap** (:func:`score_gap`): do valid reports (a(r) = 1) score above invalid ones? The validity term
  already rewards that, so a gap says the scores agree with a(r);
* **ranking** (:func:`within_group_tau`): among the *valid* reports of one group (one query, one rubric,
  scored by one evaluation each), does the score order them as the programmatic quality q(r) of
  :mod:`score_lightning.rewards.rule` does? That is what the score part adds to a(r): GRPO's advantages
  compare a group's reports with each other, so only the order within a group moves the solver. Kendall's
  τ-b per group (ties in either variable handled), averaged over the groups where it is defined.

Both intervals are 95% percentile-bootstrap intervals over *groups*, with a fixed seed: the K reports of
a group share a query, a rubric and an evaluator, so their scores are not independent and a per-report
bootstrap is too narrow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import kendalltau

RESAMPLES = 2000


def score_gap(score: np.ndarray, side: np.ndarray, group: np.ndarray,
              rng: np.random.Generator) -> tuple[float, float, float]:
    """Mean score where ``side`` minus where not, and its 95% bootstrap interval over groups (NaN when a side
    is empty). Groups, not reports, are resampled (see the module docstring)."""
    if side.all() or not side.any():
        return float("nan"), float("nan"), float("nan")
    ids = np.unique(group)
    members = [np.flatnonzero(group == g) for g in ids]
    boots = []
    for _ in range(RESAMPLES):
        pick = np.concatenate([members[i] for i in rng.integers(0, len(ids), len(ids))])
        s, y = score[pick], side[pick]
        if y.any() and not y.all():
            boots.append(s[y].mean() - s[~y].mean())
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return float(score[side].mean() - score[~side].mean()), float(lo), float(hi)


@dataclass(frozen=True)
class RankAgreement:
    """Mean within-group Kendall τ-b of score against quality, its interval, and which groups it covers."""

    tau: float  # mean over the groups it covers (NaN: none)
    lo: float  # 95% group-bootstrap interval (NaN: none)
    hi: float
    groups: int  # groups it averages: >= 2 valid reports, neither scores nor q all tied
    few: int  # groups with fewer than 2 valid reports
    tied: int  # groups with >= 2 valid reports whose scores or q are all tied (τ-b undefined)

    @property
    def excluded(self) -> int:
        return self.few + self.tied


def group_taus(score: np.ndarray, quality: np.ndarray, valid: np.ndarray,
               group: np.ndarray) -> tuple[dict[int, float], int, int]:
    """Kendall τ-b of ``score`` against ``quality`` over each group's valid reports, for the groups where it is
    defined, with the number of groups with fewer than 2 valid reports and of groups that are all tied."""
    taus: dict[int, float] = {}
    few = tied = 0
    for g in np.unique(group):
        keep = (group == g) & valid
        s, q = score[keep], quality[keep]
        if len(s) < 2:
            few += 1
        elif np.all(s == s[0]) or np.all(q == q[0]):
            tied += 1
        else:
            taus[int(g)] = float(kendalltau(s, q, variant="b").statistic)
    return taus, few, tied


def within_group_tau(score: np.ndarray, quality: np.ndarray, valid: np.ndarray, group: np.ndarray,
                     seed: int = 0, resamples: int = RESAMPLES) -> RankAgreement:
    """Mean within-group τ-b over the groups where it is defined, with a 95% bootstrap interval that resamples
    those groups (``seed`` fixes it). Arrays: one entry per scored report; ``valid`` is a(r) = 1."""
    score, quality = np.asarray(score, dtype=float), np.asarray(quality, dtype=float)
    taus, few, tied = group_taus(score, quality, np.asarray(valid, dtype=bool), np.asarray(group))
    values = np.array(list(taus.values()))
    if not len(values):
        return RankAgreement(float("nan"), float("nan"), float("nan"), 0, few, tied)
    rng = np.random.default_rng(seed)
    boots = values[rng.integers(0, len(values), (resamples, len(values)))].mean(axis=1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return RankAgreement(float(values.mean()), float(lo), float(hi), len(values), few, tied)
