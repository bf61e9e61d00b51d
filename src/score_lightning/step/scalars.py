"""Step scalars reduced over data-parallel ranks with torchmetrics, so a log is the whole batch's view.

Each rank sees only its share of the queries. A value logged as "the step's reward" must be the
pooled mean over every report of the global batch, not rank 0's. Rank-local values therefore go
through torchmetrics, whose ``compute`` synchronises the states across processes:

* pooled means (``mean``): sums and counts (or token counts) are summed over ranks, then divided;
* maxima (``max``): e.g. wall times, where the slowest rank sets the step time;
* sums (``sum``): e.g. generated tokens.

The reward metrics of :mod:`score_lightning.rewards.metrics` (``RubricReward``, ``Consistency``,
``CitationValidity``) are used directly for the rewards they define. Values that are already
global (gradient norms after the all-reduce, the EMA baseline, the broadcast rubric's validity)
are logged as they are. Every rank must create and compute the same tags in the same order:
``compute`` is collective.
"""

from __future__ import annotations

import math
import warnings

import torch
from torchmetrics import Metric
from torchmetrics.aggregation import MaxMetric, MeanMetric, SumMetric

from score_lightning.rewards.metrics import CitationValidity, Consistency, RubricReward


class StepScalars:
    """One SCORE step's rank-local scalars; ``compute()`` reduces them over ranks and resets."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.reward = self._new(RubricReward())
        self.reward_sq = self._new(MeanMetric())  # E[R^2], for the pooled std
        self.citations = self._new(CitationValidity())
        self.consistency = self._new(Consistency())
        self._metrics: dict[str, Metric] = {}
        self._differences: dict[str, tuple[str, str]] = {}
        self._exps: dict[str, str] = {}

    def _new(self, metric: Metric) -> Metric:
        metric = metric.to(self.device)
        if isinstance(metric, (MeanMetric, MaxMetric, SumMetric)):
            metric.set_dtype(torch.float64)
        return metric

    def _get(self, tag: str, kind: type[Metric]) -> Metric:
        metric = self._metrics.get(tag)
        if metric is None:
            metric = self._metrics[tag] = self._new(kind())
        if not isinstance(metric, kind):
            raise ValueError(f"scalar {tag!r} is already a {type(metric).__name__}, not a {kind.__name__}")
        return metric

    def mean(self, tag: str, total: float, count: float) -> None:
        """Add ``count`` items summing to ``total`` to the pooled mean ``tag`` (``count`` may be 0)."""
        metric = self._get(tag, MeanMetric)
        if count > 0:
            metric.update(float(total) / float(count), float(count))

    def max(self, tag: str, value: float) -> None:
        self._get(tag, MaxMetric).update(float(value))

    def sum(self, tag: str, value: float) -> None:
        self._get(tag, SumMetric).update(float(value))

    def difference(self, tag: str, minuend: str, subtrahend: str) -> None:
        """Log ``tag`` = pooled ``minuend`` - pooled ``subtrahend`` (NaN when either side saw nothing)."""
        self._differences[tag] = (minuend, subtrahend)

    def exp(self, tag: str, source: str) -> None:
        """Log ``tag`` = exp(pooled ``source``): a ratio of pooled geometric means (e.g. perplexities), which a
        mean of per-rank ratios would not be (NaN when ``source`` saw nothing)."""
        self._exps[tag] = source

    def global_mean_reward(self) -> float:
        """The pooled R_s of the step so far (collective); NaN without reports."""
        return _value(self.reward)

    def global_value(self, tag: str) -> float:
        """The pooled value of a ``mean``/``max``/``sum`` tag so far (collective); NaN when never measured."""
        return _value(self._metrics[tag])

    def global_consistency(self) -> float:
        """R_eval over every rank's queries with a consistency (collective); NaN when none had one."""
        return _value(self.consistency)

    def compute(self) -> dict[str, float]:
        """Every scalar reduced over ranks (NaN where nothing was measured); resets for the next step."""
        out = {tag: _value(self._metrics[tag]) for tag in sorted(self._metrics)}
        for tag, (a, b) in self._differences.items():
            out[tag] = out.get(a, math.nan) - out.get(b, math.nan)
        for tag, source in self._exps.items():
            v = out.get(source, math.nan)
            out[tag] = math.exp(min(v, 700.0)) if math.isfinite(v) else v
        mean = _value(self.reward)
        out["solver/reward_mean"] = mean
        out["solver/reward_std"] = math.sqrt(max(_value(self.reward_sq) - mean * mean, 0.0)) if math.isfinite(mean) else mean
        out["solver/citation_validity"] = _value(self.citations)
        out["evaluator/consistency"] = _value(self.consistency)
        for metric in (self.reward, self.reward_sq, self.citations, self.consistency, *self._metrics.values()):
            metric.reset()
        return out


def _value(metric: Metric) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "compute before update" on a rank that saw nothing: NaN is the answer
        value = metric.compute()
    return float(value) if value.numel() == 1 else float("nan")
