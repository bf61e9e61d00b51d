"""torchmetrics wrappers around the reward functions, for logging across devices.

Each metric keeps a *sum* and a *count* (both reduced with ``sum``), and ``compute`` divides
them. That gives the pooled mean over every item seen on every rank, not a mean of per-rank
means (which would over-weight a rank that saw fewer items). ``compute`` on an empty metric
returns NaN: "no item on any rank" (e.g. no group with two valid reports, so no consistency) must
not read as a measured 0. The trainer skips non-finite values when it logs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

from score_lightning.rewards.citations import citation_precision
from score_lightning.rewards.functions import group_consistency, rewards_from_parts


class _MeanMetric(Metric):
    """Sum/count state with a pooled-mean ``compute``."""

    full_state_update = False
    is_differentiable = False
    higher_is_better = True

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def _accumulate(self, total: float | Tensor, count: int) -> None:
        self.total += torch.as_tensor(total, dtype=torch.float64, device=self.total.device)
        self.count += count

    def compute(self) -> Tensor:
        if int(self.count) == 0:
            return torch.full((), float("nan"), dtype=torch.float64, device=self.total.device)
        return self.total / self.count


class RubricReward(_MeanMetric):
    """Mean solver reward R_s over reports, optionally after the reward verifier (as in training).

    ``scores`` is ``[N, k]`` with ``weights`` ``[k]``, or, with ``weights=None``, each report's rubric
    part ``[N]`` (sum_j w_j s_j already taken with its own query's rubric).
    """

    def update(self, validity: Tensor, scores: Tensor, weights: Tensor | None = None, depth: Tensor | None = None,
               min_depth: int = 0, zero: str = "reward") -> None:
        part = scores if weights is None else (scores * weights).sum(dim=-1)
        if depth is None:
            rewards = validity.to(part.dtype) * (1.0 + part)
        else:
            rewards, _, _ = rewards_from_parts(validity, part, depth, min_depth, True, zero)
        self._accumulate(rewards.detach().double().sum(), rewards.numel())


class Consistency(_MeanMetric):
    """Mean per-query consistency C_i over the groups given (the evaluator reward R_eval, pooled).

    Pass only groups that have a consistency (two or more valid reports' conclusions, see
    ``consistency_over_valid``); ``compute`` is NaN when no rank had one.
    """

    def update(self, groups: Sequence[Sequence[str]]) -> None:
        if len(groups) == 0:
            return
        per_query, _ = group_consistency(groups)
        self._accumulate(sum(per_query), len(per_query))


class CitationValidity(_MeanMetric):
    """Mean citation precision (share of distinct cited ids that were retrieved), over reports that cite
    anything: the step's ``solver/citation_validity``."""

    def update(self, pairs: Iterable[tuple[Sequence[str], Sequence[str]]]) -> None:
        values = [v for cited, retrieved in pairs if (v := citation_precision(cited, retrieved)) is not None]
        if values:
            self._accumulate(sum(values), len(values))
