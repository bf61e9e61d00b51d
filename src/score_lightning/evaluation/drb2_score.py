"""DeepResearch Bench II scores: per article, over articles, and in DRB-II's own result format.

As DRB-II's ``aggregate_scores.py`` computes them, per article (one task):

* a dimension's score = items scored 1 / items scored, over the dimension's **distinct** items
  (DRB-II keys an article's results by item text, so an item listed twice counts once);
* ``total`` = items scored 1 / items scored, over all three dimensions together (item-weighted,
  not the mean of the three dimension scores);
* ``blocked_rate`` = items scored -1 / items scored, over all three dimensions.

Over articles each score is the plain mean of the article scores (every task weighs the same), here
with its standard error. An article is scored only when the judge answered every batch of it (a
failed batch makes DRB-II drop the whole article); a missing article is left out of every mean and
counted, never scored 0.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from score_lightning.data.drb2_tasks import DIMENSIONS, Drb2Task
from score_lightning.evaluation.stats import mean_stderr

#: the per-article scores, in report order
METRICS: tuple[str, ...] = (*DIMENSIONS, "total", "blocked_rate")
LABELS = {"info_recall": "information recall", "analysis": "analysis", "presentation": "presentation",
          "total": "total (all items)", "blocked_rate": "blocked rate (-1 items)"}


def article_scores(task: Drb2Task, answers: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """The five scores of one fully answered article (``answers``: item text -> ``{"score", ...}``)."""
    out: dict[str, float | None] = {}
    ones = blocked = n = 0
    for dim in DIMENSIONS:
        scores = [answers[item]["score"] for item in task.distinct(dim)]
        d_ones = sum(s == 1 for s in scores)
        out[dim] = d_ones / len(scores) if scores else None
        ones, blocked, n = ones + d_ones, blocked + sum(s == -1 for s in scores), n + len(scores)
    out["total"] = ones / n if n else None
    out["blocked_rate"] = blocked / n if n else None
    return out


def article_record(task: Drb2Task, answers: dict[str, dict[str, Any]], batches: list[dict[str, Any]],
                   truncated: bool = False) -> dict[str, Any]:
    """An article's ``drb2`` record: every distinct item with its answer (``score`` None when its batch
    failed), the batches' outcomes, and the scores (None unless every batch was answered)."""
    failed = [b for b in batches if b.get("error")]
    items = {dim: [{"rubric_item": item, **(answers.get(item) or {"score": None})} for item in task.distinct(dim)]
             for dim in DIMENSIONS}
    return {
        "task_id": task.id, "idx": task.idx, "language": task.language,
        "scores": None if failed else article_scores(task, answers),
        "error": failed[0]["error"] if failed else None,
        "missing_items": sum(1 for dim in DIMENSIONS for it in items[dim] if it["score"] is None),
        "batches": batches, "items": items, "article_truncated_for_judge": truncated,
    }


def unmatched_record(article_id: Any) -> dict[str, Any]:
    """The ``drb2`` record of an article whose id is no task id of the tasks file."""
    return {"article_id": article_id, "task_id": None, "scores": None, "error": "no_drb2_task"}


# ---------------------------------------------------------------------------------------- summary
def summarise_drb2(records: list[dict[str, Any]], n_tasks: int | None = None) -> dict[str, Any]:
    """The ``drb2`` section of ``summary.json`` from the articles' ``drb2`` records."""
    matched = [r for r in records if r.get("task_id") is not None]
    scored = [r for r in matched if r.get("scores") is not None]
    failed = [r for r in matched if r.get("scores") is None]
    items: Counter = Counter()
    for r in matched:
        for dim_items in (r.get("items") or {}).values():
            for it in dim_items:
                items["total"] += 1
                score = it.get("score")  # data, not config
                items[{1: "satisfied", 0: "not_mentioned", -1: "blocked", None: "missing"}[score]] += 1
    scores: dict[str, Any] = {}
    for metric in METRICS:
        vals = [r["scores"][metric] for r in scored if r["scores"][metric] is not None]
        mean, se = mean_stderr(vals)
        could = [r for r in failed if metric not in DIMENSIONS or (r.get("items") or {}).get(metric)]
        scores[metric] = {"mean": mean, "stderr": se, "n": len(vals), "missing": len(could)}
    by_language: dict[str, Any] = {}
    for lang in sorted({r.get("language") or "" for r in scored}):
        vals = [r["scores"]["total"] for r in scored if (r.get("language") or "") == lang
                and r["scores"]["total"] is not None]
        mean, se = mean_stderr(vals)
        by_language[lang or "unknown"] = {"mean": mean, "stderr": se, "n": len(vals)}
    unmatched = [r for r in records if r.get("task_id") is None]
    return {
        "articles": len(records),
        "matched": len(matched),
        "unmatched": len(unmatched),
        "unmatched_ids": [r.get("article_id") for r in unmatched][:20],
        "tasks": n_tasks,
        "tasks_without_article": None if n_tasks is None else n_tasks - len({r["task_id"] for r in matched}),
        "scored": len(scored),
        "missing": len(failed),
        "missing_by_error": dict(sorted(Counter(r.get("error") or "unknown_error" for r in failed).items())),
        "items": {k: items[k] for k in ("total", "satisfied", "not_mentioned", "blocked", "missing")},
        "scores": scores,
        "total_by_language": by_language,
    }


def _fmt(value: float | None, se: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f}" + (f" ± {se:.3f}" if se is not None else " ± n/a")


def render_drb2(section: dict[str, Any], meta: dict[str, Any] | None = None) -> list[str]:
    """The report card's DeepResearch Bench II section, as Markdown lines."""
    meta = meta or {}
    lines = ["## DeepResearch Bench II rubrics", ""]
    tasks = ("" if section["tasks"] is None
             else f" ({section['tasks']} tasks; {section['tasks_without_article']} without an article)")
    lines.append(f"Tasks `{meta.get('tasks_file', '?')}`{tasks}; {section['matched']} of {section['articles']} "
                 f"articles matched a task by id; items judged in batches of {meta.get('chunk_size', '?')}.")
    lines += ["", "| score | mean ± s.e. | n articles | missing |", "| --- | --- | --- | --- |"]
    for metric in METRICS:
        s = section["scores"][metric]
        lines.append(f"| {LABELS[metric]} | {_fmt(s['mean'], s['stderr'])} | {s['n']} | {s['missing']} |")
    lines.append("")
    it = section["items"]
    lines.append(f"Items: {it['total']} (distinct per dimension) in the matched articles: {it['satisfied']} "
                 f"satisfied (1), {it['not_mentioned']} not mentioned (0), {it['blocked']} citing the blocked "
                 f"source (-1), {it['missing']} missing.")
    if section["total_by_language"]:
        by_lang = section["total_by_language"].items()
        lines.append("Total by task language: "
                     + ", ".join(f"{lang} {_fmt(v['mean'], v['stderr'])} (n {v['n']})" for lang, v in by_lang) + ".")
    if section["missing"]:
        lines.append(f"{section['missing']} articles missing (a batch still failed after its retries), by cause: "
                     + ", ".join(f"{k} {v}" for k, v in section["missing_by_error"].items()) + ".")
    if section["unmatched"]:
        lines.append(f"{section['unmatched']} articles match no task id, e.g. "
                     + ", ".join(repr(i) for i in section["unmatched_ids"][:5]) + ".")
    lines += [
        "",
        "Scores as DRB-II's aggregate_scores.py computes them: per article, a dimension's score is the "
        "share of its items scored 1, `total` the share over all items, `blocked rate` the share scored -1; "
        "the means are over articles. A missing article (a batch the judge failed to answer) is left out "
        "of every mean, never counted as 0. The judge and the prompt's wording are this run's, not "
        "DRB-II's Gemini 2.5 Pro setup (see docs/EVALUATION.md).",
        "",
    ]
    return lines


def write_drb2_results(path: str | Path, records: list[dict[str, Any]], tasks: dict[str, Drb2Task],
                       model: str) -> int:
    """DRB-II's own result lines ``{"model", "idx", "result": {"task", "scores": {dim: {item: {...}}}}}``
    (``{"error": ...}`` for a missing article), which its ``aggregate_scores.py`` reads, from the articles'
    ``drb2`` records (unmatched ones skipped). Returns the number of lines written."""
    n = 0
    with open(path, "w", encoding="utf-8") as fh:
        for r in records:
            if r.get("task_id") is None:
                continue
            task = tasks[r["task_id"]]
            if r["scores"] is None:
                result: dict[str, Any] = {"error": f"{r['error']}: a batch failed after its retries"}
            else:
                result = {"task": task.task, "scores": {
                    dim: {it["rubric_item"]: {k: it.get(k, "") for k in ("score", "reason", "evidence")}
                          for it in r["items"][dim]} for dim in DIMENSIONS}}
            fh.write(json.dumps({"model": model, "idx": task.idx, "result": result}, ensure_ascii=False) + "\n")
            n += 1
    return n
