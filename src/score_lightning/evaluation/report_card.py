"""Aggregate judge records into ``summary.json`` and a Markdown ``report_card.md``.

Per quality dimension: the mean over the articles the judge scored, its standard error
(sample standard deviation with ddof=1, divided by sqrt(n); undefined for n < 2), n, and how many
articles are missing (judge failures after retries; left out of the mean, never scored 0).

Citations: pooled counts over all cited (statement, doc_id) pairs and the valid-citation ratio
supported / (supported + unsupported), plus the per-article ratio's mean ± standard error over
articles with at least one supported or unsupported citation.

DeepResearch Bench II rubric scores (``judge --drb2-tasks``), when the records carry them, are a
section of their own (:mod:`.drb2_score`).
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from score_lightning.evaluation.drb2_score import render_drb2, summarise_drb2
from score_lightning.evaluation.judge import QUALITY_DIMENSIONS
from score_lightning.evaluation.stats import mean_stderr

__all__ = ["mean_stderr", "render_markdown", "summarise", "write_report"]


def _ratio(num: int, den: int) -> float | None:
    return num / den if den else None


def summarise(records: list[dict], meta: dict[str, Any] | None = None) -> dict[str, Any]:
    quality: dict[str, Any] = {}
    quality_errors: Counter = Counter()
    judged_quality = [r for r in records if "quality" in r]  # absent when the quality judge was off
    for r in judged_quality:
        if r["quality"] is None:
            quality_errors[r.get("quality_error") or "unknown_error"] += 1
    for dim in QUALITY_DIMENSIONS:
        vals = [float(r["quality"][dim]["score"]) for r in judged_quality if r["quality"] is not None]
        mean, se = mean_stderr(vals)
        quality[dim] = {"mean": mean, "stderr": se, "n": len(vals), "missing": len(judged_quality) - len(vals)}

    counts: Counter = Counter()
    errors: Counter = Counter()
    per_article: list[float] = []
    n_with_citations = 0
    for r in records:
        cites = r.get("citations") or []  # data, not config
        if cites:
            n_with_citations += 1
        s = u = 0
        for c in cites:
            counts["total"] += 1
            if c.get("verdict") in ("supported", "unsupported", "unknown"):
                counts[c["verdict"]] += 1
                if c.get("never_retrieved"):
                    counts["never_retrieved"] += 1
                s += c["verdict"] == "supported"
                u += c["verdict"] == "unsupported"
            else:
                counts["missing"] += 1
                errors[c.get("error") or "unknown_error"] += 1
        if s + u:
            per_article.append(s / (s + u))
    sup, uns, unk = counts["supported"], counts["unsupported"], counts["unknown"]
    pa_mean, pa_se = mean_stderr(per_article)
    citations = {
        "total": counts["total"],
        "supported": sup,
        "unsupported": uns,
        "never_retrieved": counts["never_retrieved"],
        "unknown": unk,
        "missing": counts["missing"],
        "missing_by_error": dict(sorted(errors.items())),
        "valid_citation_ratio": _ratio(sup, sup + uns),
        "valid_citation_ratio_strict": _ratio(sup, sup + uns + unk),
        "judged": sup + uns,
        "per_article": {"mean": pa_mean, "stderr": pa_se, "n": len(per_article)},
        "articles_with_citations": n_with_citations,
        "articles_without_sources": sum(1 for r in records if r.get("has_sources") is False),
    }
    summary: dict[str, Any] = {
        "n_articles": len(records),
        "quality": quality,
        "quality_missing_by_error": dict(sorted(quality_errors.items())),
        "citations": citations,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    summary["judged"] = {"quality": bool(judged_quality), "citations": any("has_sources" in r for r in records)}
    if any("drb2" in r for r in records):
        summary["drb2"] = summarise_drb2([r["drb2"] for r in records if "drb2" in r],
                                         ((meta or {}).get("drb2") or {}).get("tasks"))
    if meta:
        summary["meta"] = meta
    return summary


def _fmt(value: float | None, se: float | None, digits: int) -> str:
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}" + (f" ± {se:.{digits}f}" if se is not None else " ± n/a")


def render_markdown(summary: dict[str, Any]) -> str:
    meta = summary.get("meta", {})
    lines = ["# Report card", ""]
    if meta:
        lines.append(
            f"Judge `{meta.get('judge_model', '?')}` at `{meta.get('judge_base_url', '?')}`; "
            f"articles `{meta.get('articles', '?')}`; {summary['n_articles']} articles; {summary['created']}."
        )
        lines.append("")
    judged = summary.get("judged", {"quality": True, "citations": True})
    if judged["quality"] or judged["citations"] or "drb2" not in summary:
        lines += _quality_and_citation_lines(summary)
    if "drb2" in summary:
        lines += render_drb2(summary["drb2"], meta.get("drb2"))
    return "\n".join(lines)


def _quality_and_citation_lines(summary: dict[str, Any]) -> list[str]:
    lines = ["| metric | mean ± s.e. | n | missing |", "| --- | --- | --- | --- |"]
    for dim, q in summary["quality"].items():
        lines.append(f"| {dim} (0–10) | {_fmt(q['mean'], q['stderr'], 2)} | {q['n']} | {q['missing']} |")
    c = summary["citations"]
    ratio = "n/a" if c["valid_citation_ratio"] is None else f"{c['valid_citation_ratio']:.3f}"
    lines.append(f"| valid-citation ratio (pooled) | {ratio} | {c['judged']} citations | {c['missing']} |")
    pa = c["per_article"]
    lines.append(f"| valid-citation ratio (per article) | {_fmt(pa['mean'], pa['stderr'], 3)} | {pa['n']} articles | – |")
    lines.append("")
    strict = "n/a" if c["valid_citation_ratio_strict"] is None else f"{c['valid_citation_ratio_strict']:.3f}"
    lines.append(
        f"Citations: {c['total']} cited (statement, document) pairs in {c['articles_with_citations']} articles: "
        f"{c['supported']} supported, {c['unsupported']} unsupported (of which {c['never_retrieved']} cite a "
        f"document that was never retrieved, counted without asking the judge), {c['unknown']} unknown "
        f"(excluded from the ratio; counting them as invalid gives {strict}), {c['missing']} missing."
    )
    if c["articles_without_sources"]:
        lines.append(f"{c['articles_without_sources']} articles have no entry in the sources file; "
                     "their citations are counted as missing.")
    missing = {**{f"quality/{k}": v for k, v in summary["quality_missing_by_error"].items()},
               **{f"citation/{k}": v for k, v in c["missing_by_error"].items()}}
    if missing:
        lines.append("Missing results by cause: " + ", ".join(f"{k} {v}" for k, v in missing.items()) + ".")
    lines += [
        "",
        "Missing = the judge failed (timeout, HTTP error, unparseable reply) after its retries, or the "
        "sources needed were absent. Missing results are left out of every mean and ratio, never counted "
        "as 0. Standard error = sample standard deviation (ddof=1) / sqrt(n); n/a for n < 2. These "
        "scores come from this judge without a reference article: they are not comparable to "
        "DeepResearch Bench RACE/FACT numbers (see docs/EVALUATION.md).",
        "",
    ]
    return lines


def write_report(out_dir: str | Path, records: list[dict], meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``judgments.jsonl``, ``summary.json`` and ``report_card.md`` under ``out_dir``; return the summary."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "judgments.jsonl", "w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    summary = summarise(records, meta)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "report_card.md").write_text(render_markdown(summary), encoding="utf-8")
    return summary
