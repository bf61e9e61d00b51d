"""A held-out report card without an LLM: deterministic scores of generated articles, with CIs.

For each query (``scripts/evaluate.py card``), from the article and its sources record:

* **citation precision**: share of the article's distinct ``[doc_id]`` citations that its own
  trajectory retrieved (an uncited article has none: it is left out of this mean, and counted);
* **coverage**: share of the query's top ``coverage_k`` BM25 passages (the project's BM25 over the
  same corpus, queried with the question) that the article cites;
* **answer validity**: the trajectory's a(r) as training defines it (closed, untruncated,
  well-formed ``<answer>``, long enough);
* **length**: words in the article.

Means come with 95% percentile-bootstrap confidence intervals over queries (resampled with a fixed
seed, so the card is deterministic). A run's card against the cold-start model's card, on the same
held-out queries, is the learning evidence ``scripts/bench_learning.py`` reports.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from score_lightning.rewards.citations import citation_precision, cited_ids

METRICS = ("citation_precision", "coverage", "validity", "length")


@dataclass(frozen=True)
class Estimate:
    mean: float
    low: float
    high: float
    n: int

    def fmt(self, digits: int = 3) -> str:
        if self.n == 0:
            return "n/a"
        return f"{self.mean:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def bootstrap_ci(values: list[float], resamples: int = 2000, seed: int = 0, level: float = 0.95) -> Estimate:
    """Mean and percentile-bootstrap CI over the given per-query values (deterministic for a seed)."""
    vals = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if vals.size == 0:
        return Estimate(math.nan, math.nan, math.nan, 0)
    rng = np.random.default_rng(seed)
    means = vals[rng.integers(0, vals.size, size=(resamples, vals.size))].mean(axis=1)
    tail = (1.0 - level) / 2.0
    return Estimate(float(vals.mean()), float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail)), int(vals.size))


def query_scores(article: str, source: dict, top_ids: list[str]) -> dict[str, float | None]:
    """The four scores of one article (``None``: undefined, e.g. precision of an uncited article)."""
    cites = cited_ids(article)
    return {
        "citation_precision": citation_precision(cites, source.get("retrieved_ids", [])),
        "coverage": (len(set(cites) & set(top_ids)) / len(top_ids)) if top_ids else None,
        "validity": float(bool(source.get("valid_answer", False))),
        "length": float(len(article.split())),
    }


def report_card(articles: Path, sources: Path, retriever, coverage_k: int = 5) -> dict:
    """Per-query scores and the summary with CIs, for every article that has a sources record."""
    arts = [json.loads(line) for line in open(articles, encoding="utf-8") if line.strip()]
    srcs = {str(s["id"]): s for s in (json.loads(line) for line in open(sources, encoding="utf-8") if line.strip())}
    rows = []
    tops = retriever.search([a["prompt"] for a in arts], coverage_k) if arts else []
    for art, top in zip(arts, tops):
        src = srcs.get(str(art["id"]))
        if src is None:
            continue
        rows.append({"id": art["id"], **query_scores(art["article"], src, [h.id for h in top])})
    summary = {m: bootstrap_ci([r[m] for r in rows]) for m in METRICS}
    return {"queries": len(rows), "per_query": rows,
            "summary": {m: {"mean": e.mean, "ci95": [e.low, e.high], "n": e.n} for m, e in summary.items()},
            "uncited": sum(r["citation_precision"] is None for r in rows)}


def render(card: dict) -> str:
    """A markdown table of the summary."""
    lines = ["| metric | mean [95% CI] | queries |", "| --- | --- | --- |"]
    for m in METRICS:
        s = card["summary"][m]
        est = Estimate(s["mean"], s["ci95"][0], s["ci95"][1], s["n"])
        lines.append(f"| {m} | {est.fmt(1 if m == 'length' else 3)} | {s['n']} |")
    return "\n".join(lines)
