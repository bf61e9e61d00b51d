"""How well an evaluator's scores order known pairs: the metrics of ``scripts/bench_evaluator.py`` (pure).

The three metrics the preference-trained rubric-generator work reports, over pairs with a known better side
(:mod:`score_lightning.evaluation.pair_build`), each from the two scores of a pair (the rubric-weighted
Σ_j w_j s_j the reward uses):

* **pairwise accuracy**: the share of pairs whose better side scores higher; a tie counts 0.5 (an evaluator
  that scores everything alike sits at 0.5, as chance does);
* **AUC**: the ROC AUC of "better side" against "worse side" over the pooled scores (every pair adds one
  score to each class; ties count half, as in the Mann-Whitney statistic, ``sklearn.metrics.roc_auc_score``).
  Unlike pairwise accuracy it also compares sides of different pairs: a score scale shared across queries;
* **Cohen's d**: mean score of the better sides minus mean of the worse sides, over their pooled standard
  deviation (each side's variance with ddof 1); NaN when that deviation is 0.

Each comes with a 95% percentile-bootstrap interval that resamples *queries* with replacement (their pairs
together: the pairs of a query share its reports and rubric, so they are not independent), with a fixed seed,
so the same scores always give the same intervals. A resample whose statistic is undefined is left out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from sklearn.metrics import roc_auc_score

RESAMPLES = 2000
LEVEL = 0.95


def pair_outcomes(better: Sequence[float], worse: Sequence[float]) -> np.ndarray:
    """1 where the better side scores higher, 0.5 on a tie, 0 where it scores lower."""
    b, w = np.asarray(better, dtype=float), np.asarray(worse, dtype=float)
    return np.where(b > w, 1.0, np.where(b == w, 0.5, 0.0))


def pair_accuracy(better: Sequence[float], worse: Sequence[float]) -> float:
    out = pair_outcomes(better, worse)
    return float(out.mean()) if out.size else math.nan


def pooled_auc(better: Sequence[float], worse: Sequence[float]) -> float:
    """ROC AUC of the better sides (label 1) against the worse sides (label 0), scores pooled."""
    b, w = np.asarray(better, dtype=float), np.asarray(worse, dtype=float)
    if not b.size or not w.size:
        return math.nan
    labels = np.concatenate([np.ones(b.size), np.zeros(w.size)])
    return float(roc_auc_score(labels, np.concatenate([b, w])))


def cohens_d(better: Sequence[float], worse: Sequence[float]) -> float:
    """(mean better − mean worse) / pooled SD, sample variances (ddof 1); NaN when undefined."""
    b, w = np.asarray(better, dtype=float), np.asarray(worse, dtype=float)
    if b.size < 2 or w.size < 2:
        return math.nan
    pooled = ((b.size - 1) * b.var(ddof=1) + (w.size - 1) * w.var(ddof=1)) / (b.size + w.size - 2)
    if pooled <= 0:
        return math.nan
    return float((b.mean() - w.mean()) / math.sqrt(pooled))


STATISTICS = {"pair_acc": pair_accuracy, "auc": pooled_auc, "cohen_d": cohens_d}


@dataclass(frozen=True)
class Interval:
    value: float
    lo: float
    hi: float


@dataclass(frozen=True)
class KindSummary:
    """The metrics of one set of pairs (one edit kind, all degraded, valid, or all)."""

    pairs: int
    queries: int
    pair_acc: Interval
    auc: Interval
    cohen_d: Interval
    mean_better: float
    mean_worse: float
    ties: int

    def to_dict(self) -> dict:
        return asdict(self)


def query_bootstrap(query: Sequence[str], better: Sequence[float], worse: Sequence[float], statistic,
                    resamples: int = RESAMPLES, seed: int = 0, level: float = LEVEL) -> tuple[float, float]:
    """Percentile interval of ``statistic(better, worse)`` over resampled queries (NaN when none is defined)."""
    q = np.asarray(query)
    b, w = np.asarray(better, dtype=float), np.asarray(worse, dtype=float)
    ids = np.unique(q)
    if not ids.size:
        return math.nan, math.nan
    members = [np.flatnonzero(q == i) for i in ids]
    rng = np.random.default_rng(seed)
    values = []
    for draw in rng.integers(0, ids.size, size=(resamples, ids.size)):
        pick = np.concatenate([members[i] for i in draw])
        v = statistic(b[pick], w[pick])
        if math.isfinite(v):
            values.append(v)
    if not values:
        return math.nan, math.nan
    tail = (1.0 - level) / 2.0
    return float(np.quantile(values, tail)), float(np.quantile(values, 1 - tail))


def summarise(query: Sequence[str], better: Sequence[float], worse: Sequence[float],
              resamples: int = RESAMPLES, seed: int = 0) -> KindSummary:
    """Every metric of these pairs (one entry per pair in each argument) with its query-bootstrap interval."""
    b, w = np.asarray(better, dtype=float), np.asarray(worse, dtype=float)
    out = {}
    for name, stat in STATISTICS.items():
        value = stat(b, w) if b.size else math.nan
        lo, hi = query_bootstrap(query, b, w, stat, resamples, seed) if b.size else (math.nan, math.nan)
        out[name] = Interval(value, lo, hi)
    return KindSummary(int(b.size), int(len(set(query))), out["pair_acc"], out["auc"], out["cohen_d"],
                       float(b.mean()) if b.size else math.nan, float(w.mean()) if w.size else math.nan,
                       int((b == w).sum()))


def summarise_kinds(rows: Sequence[tuple[str, str, float, float]], kinds: Sequence[str],
                    resamples: int = RESAMPLES, seed: int = 0) -> dict[str, KindSummary]:
    """``rows``: one ``(query_id, kind, better score, worse score)`` per scored pair. Returns a summary per edit
    kind in ``kinds`` that has pairs, then ``degraded`` (every kind but ``valid``), ``valid`` and ``all``."""
    groups: dict[str, list] = {k: [r for r in rows if r[1] == k] for k in kinds}
    groups = {k: v for k, v in groups.items() if v}
    groups["degraded"] = [r for r in rows if r[1] != "valid"]
    groups["valid"] = [r for r in rows if r[1] == "valid"]
    groups["all"] = list(rows)
    return {k: summarise([r[0] for r in v], [r[2] for r in v], [r[3] for r in v], resamples, seed)
            for k, v in groups.items()}


def _num(x: float, digits: int = 3) -> str:
    return "nan" if not math.isfinite(x) else f"{x:.{digits}f}"


def _ci(iv: Interval) -> str:
    return f"[{_num(iv.lo)},{_num(iv.hi)}]"


def last_line(summary: dict[str, KindSummary]) -> str:
    """``pairs=N pair_acc=x pair_acc_ci=[lo,hi] valid_pairs=M valid_pair_acc=y valid_pair_acc_ci=[lo,hi] auc=z
    cohen_d=d``: N and pair_acc over the degraded pairs, M and valid_pair_acc over the valid pairs, AUC and d over
    all scored pairs."""
    d, v, a = summary["degraded"], summary["valid"], summary["all"]
    return (f"pairs={d.pairs} pair_acc={_num(d.pair_acc.value)} pair_acc_ci={_ci(d.pair_acc)} "
            f"valid_pairs={v.pairs} valid_pair_acc={_num(v.pair_acc.value)} valid_pair_acc_ci={_ci(v.pair_acc)} "
            f"auc={_num(a.auc.value)} cohen_d={_num(a.cohen_d.value)}")


def table(summary: dict[str, KindSummary]) -> list[str]:
    """A markdown table of every summary (the lines BENCHMARKS quotes)."""
    out = ["| pairs | n | queries | pair acc [95% CI] | AUC [95% CI] | Cohen's d [95% CI] | ties "
           "| mean better / worse |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for kind, s in summary.items():
        cells = [f"{_num(iv.value)} {_ci(iv)}" for iv in (s.pair_acc, s.auc, s.cohen_d)]
        out.append(f"| {kind} | {s.pairs} | {s.queries} | {' | '.join(cells)} | {s.ties} | "
                   f"{_num(s.mean_better)} / {_num(s.mean_worse)} |")
    return out
