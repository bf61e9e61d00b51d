"""A held-out report card without an LLM: deterministic scores of generated articles, with CIs.

For each sampled answer (``scripts/evaluate.py card``), from its sources record (and, for files written
before the sources held the article text, the article file's sample 0):

* **grounded_valid**: the answer is valid under the reward's own a(r) with ``reward.citations=retrieved``:
  a closed, untruncated, well-formed ``<answer>``, long enough (the run's ``reward.min_answer_chars``),
  citing at least one id and only ids its own trajectory retrieved. It is the lever RL pulls; read from
  the record's ``grounded_valid`` (older records: ``valid_answer`` and ``cites_only_retrieved``);
* **format_valid**: the format rule alone (closed, untruncated, long enough; no citation needed), the
  record's ``valid_answer``. Cards made before this split called it ``validity``;
* **citation precision**: share of the answer's distinct ``[doc_id]`` citations that its own trajectory
  retrieved (an uncited answer has none: it is left out of this mean, and counted as ``uncited``);
* **coverage**: share of the query's top ``coverage_k`` BM25 passages (the project's BM25 over the
  same corpus, queried with the question) that the answer cites;
* **item_recall**: the share of the query's evidence items (``--items``: the embedded queries' own by
  default, ``scripts/build_rubrics.py``) that the answer satisfies, each cited, retrieved by its own
  trajectory and stated (:mod:`score_lightning.rewards.items`); 0 for an answer that is not grounded-valid.
  Queries without items (or whose prompt differs from the items file's) have none;
* **citations**: distinct ids the answer cites;
* **length**: words in the answer.

A query's value is the mean over its samples (``generate --samples N``); the card's mean is over queries,
with a 95% percentile-bootstrap interval that resamples queries (fixed seed, so the card is
deterministic). With 20 held-out queries x 8 samples, ``grounded_valid``'s standard error is about 0.025
near 0.1 (a 95% interval of about +-0.03 near 0.05, +-0.05 near 0.125; one sample per query: +-0.11 near 0.1).
The card carries the settings the articles were generated under (``<articles>.settings.json``) and the
digest of the item set it scored ``item_recall`` on; :func:`compare_cards` refuses to compare two cards
whose settings or item sets differ.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from score_lightning.evaluation.settings import describe_diff, settings_diff
from score_lightning.rewards.citations import citation_precision, cited_ids
from score_lightning.rewards.items import ItemLike, item_recall

METRICS = ("grounded_valid", "format_valid", "citation_precision", "coverage", "item_recall", "citations", "length")
#: names older cards used, read as the current ones
LEGACY_NAMES = {"validity": "format_valid"}


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


class CardMismatch(ValueError):
    """Two cards were made under different settings (or on different queries): their difference means nothing."""

    def __init__(self, message: str, keys: list[str]):
        super().__init__(message)
        self.keys = keys


def bootstrap_ci(values: list[float], resamples: int = 2000, seed: int = 0, level: float = 0.95) -> Estimate:
    """Mean and percentile-bootstrap CI over the given per-query values (deterministic for a seed)."""
    vals = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if vals.size == 0:
        return Estimate(math.nan, math.nan, math.nan, 0)
    rng = np.random.default_rng(seed)
    means = vals[rng.integers(0, vals.size, size=(resamples, vals.size))].mean(axis=1)
    tail = (1.0 - level) / 2.0
    return Estimate(float(vals.mean()), float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail)), int(vals.size))


def grounded_of(source: dict) -> float | None:
    """The record's grounded validity; for records written before the field, the format rule and the
    grounding rule together (the same a(r) at the default 20 characters); ``None`` when neither is there."""
    if "grounded_valid" in source:
        return float(bool(source["grounded_valid"]))
    if "valid_answer" in source and "cites_only_retrieved" in source:
        return float(bool(source["valid_answer"]) and bool(source["cites_only_retrieved"]))
    return None


def query_scores(article: str, source: dict, top_ids: list[str],
                 items: list[ItemLike] | None = None) -> dict[str, float | None]:
    """The scores of one sampled answer (``None``: undefined, e.g. precision of an uncited answer, or
    ``item_recall`` of a query without items)."""
    cites = cited_ids(article, known_ids=set(source.get("retrieved_ids", [])))
    grounded = grounded_of(source)
    recall = None if not items or grounded is None else item_recall(items, article, source.get("retrieved_ids", []),
                                                                     grounded > 0)
    return {
        "grounded_valid": grounded,
        "format_valid": float(bool(source["valid_answer"])) if "valid_answer" in source else None,
        "citation_precision": citation_precision(cites, source.get("retrieved_ids", [])),
        "coverage": (len(set(cites) & set(top_ids)) / len(top_ids)) if top_ids else None,
        "item_recall": recall,
        "citations": float(len(cites)),
        "length": float(len(article.split())),
    }


def mean_over_samples(scores: list[dict[str, float | None]]) -> dict[str, float | None]:
    """A query's value per metric: the mean over its samples where defined (``None`` where none is)."""
    out: dict[str, float | None] = {}
    for m in METRICS:
        vals = [s[m] for s in scores if s.get(m) is not None]
        out[m] = sum(vals) / len(vals) if vals else None
    return out


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]


def _samples_by_id(sources: Path) -> dict[str, dict[int, dict]]:
    """Sources records per id and sample (the last record of each; no ``sample`` field: sample 0)."""
    out: dict[str, dict[int, dict]] = {}
    for rec in _read_jsonl(sources):
        out.setdefault(str(rec["id"]), {})[int(rec.get("sample", 0))] = rec
    return out


def report_card(articles: Path, sources: Path, retriever, coverage_k: int = 5, generation: dict | None = None,
                items: dict | None = None, items_set: dict | None = None) -> dict:
    """Per-query scores (means over samples) and the summary with CIs, for every article with a sources record.

    ``generation``: the settings sidecar ``generate`` wrote (its ``settings`` become the card's). ``items``:
    ``{query id: QueryItems}`` (a query's items count only when its prompt is the article's), and
    ``items_set`` the identity of that file (``{"path", "digest"}``) the card records.
    """
    arts = _read_jsonl(articles)
    srcs = _samples_by_id(sources)
    rows, answers, uncited = [], 0, 0
    tops = retriever.search([a["prompt"] for a in arts], coverage_k) if arts else []
    for art, top in zip(arts, tops):
        recs = srcs.get(str(art["id"]))
        if not recs:
            continue
        top_ids = [h.id for h in top]
        entry = (items or {}).get(str(art["id"]))
        its = entry.items if entry is not None and entry.prompt.strip() == str(art["prompt"]).strip() else None
        scores = []
        for k, rec in sorted(recs.items()):
            text = rec.get("article", art["article"] if k == 0 else None)
            if text is not None:
                scores.append(query_scores(text, rec, top_ids, its))
        answers += len(scores)
        uncited += sum(s["citation_precision"] is None for s in scores)
        rows.append({"id": art["id"], "samples": len(scores), **mean_over_samples(scores)})
    summary = {m: bootstrap_ci([r[m] for r in rows]) for m in METRICS}
    gen = generation or {}
    return {"queries": len(rows), "answers": answers, "uncited": uncited, "per_query": rows,
            "summary": {m: {"mean": e.mean, "ci95": [e.low, e.high], "n": e.n} for m, e in summary.items()},
            "settings": gen.get("settings"), "items": items_set if items else None,
            "generation": {k: v for k, v in gen.items() if k != "settings"} or None}


def normalise_card(card: dict) -> dict:
    """A card as the current code writes it: old metric names renamed, missing fields ``None``."""
    card = dict(card)
    for old, new in LEGACY_NAMES.items():
        summary = dict(card.get("summary", {}))
        if old in summary and new not in summary:
            summary[new] = summary.pop(old)
        card["summary"] = summary
        card["per_query"] = [{(new if k == old else k): v for k, v in row.items()} for row in card.get("per_query", [])]
    card.setdefault("settings", None)
    card.setdefault("items", None)
    return card


def load_card(path: str | Path) -> dict:
    """Read a card JSON (any version) via :func:`normalise_card`."""
    return normalise_card(json.loads(Path(path).read_text(encoding="utf-8")))


def compare_cards(card: dict, baseline: dict, resamples: int = 2000) -> dict:
    """Each metric's difference, this card minus ``baseline``, with a paired 95% bootstrap interval over
    the queries both scored.

    Raises :class:`CardMismatch` naming the differing keys when the cards' settings differ (or a card has
    none), or when they scored different queries: a difference would then measure the settings, not the model.
    """
    card, baseline = normalise_card(card), normalise_card(baseline)
    keys = settings_diff(card["settings"], baseline["settings"])
    if keys:
        raise CardMismatch(f"the cards were generated under different settings: "
                           f"{describe_diff(card['settings'], baseline['settings'])}; regenerate one of them under "
                           "the other's settings (see its <articles>.settings.json)", keys)
    mine_items, their_items = (card["items"] or {}).get("digest"), (baseline["items"] or {}).get("digest")
    if mine_items != their_items:
        raise CardMismatch(f"the cards scored item_recall on different item sets ({mine_items or 'none'} against "
                           f"{their_items or 'none'}); make both with the same --items file", ["items"])
    mine = {str(r["id"]): r for r in card.get("per_query", [])}
    theirs = {str(r["id"]): r for r in baseline.get("per_query", [])}
    if set(mine) != set(theirs):
        only = sorted(set(mine) ^ set(theirs))
        raise CardMismatch(f"the cards scored different queries ({len(only)} ids in only one, e.g. {only[:3]})",
                           ["query ids"])
    out = {}
    for m in METRICS:
        a = card["summary"].get(m, {}).get("mean")
        b = baseline["summary"].get(m, {}).get("mean")
        deltas = [mine[i][m] - theirs[i][m] for i in sorted(mine)
                  if mine[i].get(m) is not None and theirs[i].get(m) is not None]
        est = bootstrap_ci(deltas, resamples)
        out[m] = {"card": a, "baseline": b, "delta": est.mean, "ci95": [est.low, est.high], "n": est.n}
    return {"queries": len(mine), "metrics": out}


def render(card: dict) -> str:
    """A markdown table of the summary."""
    lines = ["| metric | mean [95% CI] | queries |", "| --- | --- | --- |"]
    for m in METRICS:
        s = card["summary"].get(m)
        if s is None:  # a card made before the metric existed
            continue
        est = Estimate(s["mean"], s["ci95"][0], s["ci95"][1], s["n"])
        lines.append(f"| {m} | {est.fmt(1 if m in ('length', 'citations') else 3)} | {s['n']} |")
    return "\n".join(lines)


def render_comparison(cmp: dict) -> str:
    """A markdown table of :func:`compare_cards`: this card, the baseline, and the paired difference."""
    lines = ["| metric | this card | baseline | difference [95% CI] | queries |", "| --- | --- | --- | --- | --- |"]
    def num(v: float | None, digits: int) -> str:
        return "n/a" if v is None or not math.isfinite(v) else f"{v:.{digits}f}"

    for m, c in cmp["metrics"].items():
        digits = 1 if m in ("length", "citations") else 3
        est = Estimate(c["delta"], c["ci95"][0], c["ci95"][1], c["n"])
        lines.append(f"| {m} | {num(c['card'], digits)} | {num(c['baseline'], digits)} | {est.fmt(digits)} | {c['n']} |")
    return "\n".join(lines)
