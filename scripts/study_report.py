"""The learning study's tables and summary lines (``scripts/bench_learning.py``), from its cells' results.

Every interval is a 95% t-interval over seeds of per-seed values: a change over the cold start's card, a
reward slope, or a paired (same seed) difference between two conditions.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import shlex
from pathlib import Path
from statistics import mean, stdev

ROOT = Path(__file__).resolve().parents[1]
#: two-sided 97.5% quantiles of Student's t by degrees of freedom (95% intervals over seeds)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def ci95(values: list[float]) -> tuple[float, float, int]:
    """Mean and half-width of the 95% t-interval (NaN half-width with fewer than 2 values)."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return math.nan, math.nan, 0
    if len(vals) < 2:
        return vals[0], math.nan, 1
    return mean(vals), T975.get(len(vals) - 1, 1.96) * stdev(vals) / math.sqrt(len(vals)), len(vals)


def fmt(values: list[float], digits: int = 3, signed: bool = True) -> str:
    """Mean ± half-width; ``signed`` for changes, unsigned for levels (an accuracy, seconds)."""
    m, h, n = ci95(values)
    if n == 0:
        return "n/a"
    return f"{m:{'+' if signed else ''}.{digits}f}" + ("" if math.isnan(h) else f" ± {h:.{digits}f}")


def interval(values: list[float], digits: int = 3) -> tuple[str, str]:
    """``+x`` and ``[lo,hi]`` of the 95% t-interval, for the parseable summary line."""
    m, h, n = ci95(values)
    if n == 0:
        return "nan", "[nan,nan]"
    if math.isnan(h):
        return f"{m:+.{digits}f}", "[nan,nan]"
    return f"{m:+.{digits}f}", f"[{m - h:+.{digits}f},{m + h:+.{digits}f}]"


def _num(v: float | None) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"


def delta(r: dict, cold: dict, horizon: int, key: str = "grounded_valid") -> float:
    card = r["heldout"].get(str(horizon), {})
    v, c = card.get(key), cold.get(key)
    return v - c if v is not None and c is not None else math.nan


def greedy_delta(r: dict, cold: dict, key: str = "grounded_valid") -> float:
    """The greedy card's change (one greedy rollout per query), when both sides have one."""
    v, c = (r.get("heldout_greedy") or {}).get(key), (cold.get("greedy") or {}).get(key)
    return v - c if v is not None and c is not None else math.nan


def _by(results: list[dict]) -> dict[tuple[str, int], dict]:
    return {(r["condition"], r["seed"]): r for r in results}


def paired(results: list[dict], a: str, b: str, value) -> list[float]:
    """Per seed that has both: value(a's cell) - value(b's cell)."""
    by = _by(results)
    seeds = sorted({s for c, s in by if c == a} & {s for c, s in by if c == b})
    return [value(by[(a, s)]) - value(by[(b, s)]) for s in seeds]


def pair_list(conds: list[str], against: str | None) -> list[tuple[str, str]]:
    """Each condition against ``against`` when it is one of them, else every pair in the given order."""
    if against in conds:
        return [(c, against) for c in conds if c != against]
    return [(a, b) for i, a in enumerate(conds) for b in conds[i + 1:]]


def bracket(values: list[float], digits: int = 3, signed: bool = True) -> str:
    """``+m [lo, hi]``, the 95% t-interval over seeds as a reader reads it (``+m`` alone with one seed); unsigned
    for a level (an accuracy)."""
    m, h, n = ci95(values)
    if n == 0:
        return "n/a"
    sign = "+" if signed else ""
    return f"{m:{sign}.{digits}f}" + ("" if math.isnan(h) else f" [{m - h:{sign}.{digits}f}, {m + h:{sign}.{digits}f}]")


def train_values(key: str, rows: list[dict]) -> list[float]:
    """The cells' finite ``train[key]`` values (a health scalar, seconds per step)."""
    return [v for v in (r["train"].get(key) for r in rows) if v is not None and math.isfinite(v)]


def pair_values(source: str, key: str, when: str, rows: list[dict]) -> list[float]:
    """The cells' finite evaluator readings ``result[source][when][key]`` (``when``: cold_start or end)."""
    vals = [((r.get(source) or {}).get(when) or {}).get(key) for r in rows]
    return [v for v in vals if v is not None and math.isfinite(v)]


def glance_table(results: list[dict], colds: dict[str, dict], conds: list[str], last: int,
                 against: str | None) -> list[str]:
    """One row per condition for a reader choosing a method: what it learns held out (its change over its own cold
    start, and paired against ``against``), whether its evaluator ranks valid reports, what a step costs."""
    head = ["condition", "seeds", f"Δ held-out grounded valid @{last}"]
    head += [f"paired − {against}"] if against in conds else []
    head += [f"Δ held-out item recall @{last}", "evaluator valid-pair acc, start → end", "s / step"]
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for c in conds:
        rows = [r for r in results if r["condition"] == c]
        cells = [c, str(len(rows)), bracket([delta(r, colds[c], last) for r in rows])]
        if against in conds:
            cells.append("–" if c == against else
                         bracket(paired(results, c, against, lambda r: delta(r, colds[r["condition"]], last))))
        cells.append(bracket([delta(r, colds[c], last, "item_recall") for r in rows]))
        start, end = (pair_values("evaluator_pairs", "valid_pair_acc", w, rows) for w in ("cold_start", "end"))
        start_text = f"{mean(start):.3f}" if start else "n/a"  # one cold start: the same reading on every seed
        cells.append(f"{start_text} → {bracket(end, signed=False)}" if end else "–")
        secs = train_values("seconds_per_step", rows)
        cells.append(fmt(secs, 2, signed=False) if secs else "–")
        out.append("| " + " | ".join(cells) + " |")
    return out


def report(results: list[dict], colds: dict[str, dict], conditions: list[str], horizons: list[int],
           against: str | None = None) -> str:
    """Per condition: the held-out change at each horizon over its own cold start (``colds[condition]``), the
    reward slope, the training gains; each method's health and cost where any cell logged them; then the paired
    differences at the last horizon, of every pair of conditions or (``against``) of each against that one."""
    last = max(horizons)
    conds = [c for c in conditions if any(r["condition"] == c for r in results)]
    head = (["condition", "seeds"] + [f"Δ grounded valid @{h}" for h in horizons]
            + [f"Δ item recall @{last}", f"Δ citation precision @{last}", f"Δ format valid @{last}",
               f"Δ greedy grounded valid @{last}",
               "reward slope /100 steps", "validity-part slope /100 steps", "zero-variance groups",
               "score gap valid − invalid", "within-group τ (valid)"])
    lines = ["At a glance (each change over the condition's own cold start; [95% t-interval over seeds]):", "",
             *glance_table(results, colds, conds, last, against), "", "In full:", "",
             "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for c in conds:
        rows = [r for r in results if r["condition"] == c]
        cold = colds[c]
        cells = [c, str(len(rows))] + [fmt([delta(r, cold, h) for r in rows]) for h in horizons]
        cells += [fmt([delta(r, cold, last, "item_recall") for r in rows]),
                  fmt([delta(r, cold, last, "citation_precision") for r in rows]),
                  fmt([delta(r, cold, last, "format_valid") for r in rows]), fmt([greedy_delta(r, cold) for r in rows]),
                  fmt([r["train"]["reward_slope"] for r in rows]), fmt([r["train"]["validity_slope"] for r in rows]),
                  fmt([r["train"].get("zero_variance_mean", math.nan) for r in rows]),
                  fmt([r["train"].get("score_gap_mean", math.nan) for r in rows]),
                  fmt([r["train"].get("rank_tau_mean", math.nan) for r in rows])]
        lines.append("| " + " | ".join(cells) + " |")
    lines += health_table(results, conds)
    lines += ["", *cold_lines(colds, conds)]
    pairs = pair_list(conds, against)
    if pairs:
        lines += ["", f"Paired differences (same seed), at {last} steps (each side's change over its own cold start):",
                  "", "| pair | seeds | Δ held-out grounded valid | Δ held-out item recall | Δ reward slope /100 steps |",
                  "| --- | --- | --- | --- | --- |"]
        for a, b in pairs:
            dv = paired(results, a, b, lambda r: delta(r, colds[r["condition"]], last))
            di = paired(results, a, b, lambda r: delta(r, colds[r["condition"]], last, "item_recall"))
            ds = paired(results, a, b, lambda r: r["train"]["reward_slope"])
            lines.append(f"| {a} − {b} | {len(dv)} | {fmt(dv)} | {fmt(di)} | {fmt(ds)} |")
    return "\n".join(lines)


#: the health columns (``study_cells.HEALTH_TAGS``' keys) and cost, by header
HEALTH_COLUMNS = (("rubric write-fail rate", "write_fail_mean"), ("items per query", "items_per_query_mean"),
                  ("step-judge valid", "step_judge_valid_mean"), ("stage-judge valid", "stage_judge_valid_mean"),
                  ("invalid actions /step", "invalid_actions_mean"), ("s / step", "seconds_per_step"))


#: the evaluator's pair-set statistics (``bench_evaluator.py`` on a stored pair set), by header; a column shows
#: only where some cell's end value is finite (a preference pair set has no degraded pairs, for one)
PAIR_COLUMNS = (("valid-pair acc", "valid_pair_acc"), ("degraded-pair acc", "pair_acc"),
                ("pair AUC", "auc"), ("pair Cohen's d", "cohen_d"))
#: where a cell keeps them, by header prefix: a stored pair set (``--evaluator-pairs``), and each model's own
#: held-out reports (``--evaluator-probe``)
PAIR_SOURCES = (("evaluator_pairs", ""), ("evaluator_probe", "own reports: "))


def health_table(results: list[dict], conds: list[str]) -> list[str]:
    """Each method's own health scalars and seconds per step (mean over its steps, then over seeds), and the
    evaluator's pair-set statistics at the cold start and at the end, where cells have them: ``valid_pair_acc``,
    degraded-pair accuracy, and the AUC and Cohen's d over all scored pairs (the preference-writer paper's
    held-out metrics)."""
    cols = [(h, k) for h, k in HEALTH_COLUMNS if train_values(k, results)]
    pair_cols = [(f"{prefix}{h}", src, k) for src, prefix in PAIR_SOURCES for h, k in PAIR_COLUMNS
                 if pair_values(src, k, "end", results)]
    if not cols and not pair_cols:
        return []
    head = ["condition"] + [h for h, _ in cols] + [f"{h}, cold start → end" for h, _, _ in pair_cols]
    out = ["", "Health and cost (mean over steps, then ± the 95% t-interval over seeds):", "",
           "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for c in conds:
        rows = [r for r in results if r["condition"] == c]
        cells = [c]
        for _, k in cols:
            values = train_values(k, rows)
            cells.append(fmt(values, 2 if k == "seconds_per_step" else 3, signed=False) if values else "–")
        for _, src, key in pair_cols:
            start, end = pair_values(src, key, "cold_start", rows), pair_values(src, key, "end", rows)
            signed = key == "cohen_d"
            cells.append(f"{fmt(start, signed=signed)} → {fmt(end, signed=signed)}" if end else "–")
        out.append("| " + " | ".join(cells) + " |")
    return out


def cold_lines(colds: dict[str, dict], conds: list[str]) -> list[str]:
    """One line per distinct cold-start card, naming the conditions measured against it."""
    groups: dict[int, list[str]] = {}
    for c in conds:
        groups.setdefault(id(colds[c]), []).append(c)
    out = []
    for members in groups.values():
        cold = colds[members[0]]
        out.append(f"Cold start of {', '.join(members)} (the same held-out rollouts and settings): grounded valid "
                   f"{_num(cold.get('grounded_valid'))}, format valid {_num(cold.get('format_valid'))}, citation "
                   f"precision {_num(cold.get('citation_precision'))}, item recall {_num(cold.get('item_recall'))}.")
    return out


def summary_lines(results: list[dict], colds: dict[str, dict], conditions: list[str], horizon: int) -> list[str]:
    """One parseable line per condition (the module docstring of ``bench_learning.py``), each over its own cold
    start (``colds[condition]``)."""
    out = []
    for c in conditions:
        rows = [r for r in results if r["condition"] == c]
        if not rows:
            continue
        cold = colds[c]
        dv, dv_ci = interval([delta(r, cold, horizon) for r in rows])
        dr, dr_ci = interval([delta(r, cold, horizon, "item_recall") for r in rows])
        sl, sl_ci = interval([r["train"]["reward_slope"] for r in rows])
        out.append(f"condition={c} seeds={len(rows)} heldout_valid_delta={dv} heldout_valid_delta_ci={dv_ci} "
                   f"heldout_recall_delta={dr} heldout_recall_delta_ci={dr_ci} "
                   f"reward_slope={sl} reward_slope_ci={sl_ci}")
    return out


def paired_lines(results: list[dict], colds: dict[str, dict], conditions: list[str], horizon: int,
                 against: str | None = None) -> list[str]:
    """One parseable line per pair (``pair_list``), printed before the per-condition lines (which stay last):
    ``pair=A-B seeds=N heldout_valid_delta=… heldout_valid_delta_ci=[…] heldout_recall_delta=…
    heldout_recall_delta_ci=[…]``, the same-seed difference of A's and B's changes over their own cold starts."""
    conds = [c for c in conditions if any(r["condition"] == c for r in results)]
    out = []
    for a, b in pair_list(conds, against):
        dv = paired(results, a, b, lambda r: delta(r, colds[r["condition"]], horizon))
        dr = paired(results, a, b, lambda r: delta(r, colds[r["condition"]], horizon, "item_recall"))
        (v, v_ci), (i, i_ci) = interval(dv), interval(dr)
        out.append(f"pair={a}-{b} seeds={len(dv)} heldout_valid_delta={v} heldout_valid_delta_ci={v_ci} "
                   f"heldout_recall_delta={i} heldout_recall_delta_ci={i_ci}")
    return out


def study_page(archive: str | None, page: str | None) -> Path:
    """The page a study's section goes to: its own under docs/studies/ (BENCHMARKS.md holds current figures only).

    ``page`` (``--page``) wins; else the page beside the archive folder (``docs/studies/v9`` -> ``docs/studies/v9.md``,
    so the record sits by its cells); else a dated page of its own."""
    if page:
        return Path(page)
    if archive:
        return Path(archive).with_name(Path(archive).name + ".md")
    return ROOT / "docs" / "studies" / f"learning-{dt.date.today().isoformat()}.md"


def write_section(text: str, lines: list[str], argv: list[str], conditions: list[str], seeds: list[int],
                  horizons: list[int], samples: int, page: Path) -> None:
    """Append the study's section, with its exact command and machine, to its page (a new page gets a title)."""
    import platform

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
    section = f"""

## {dt.date.today().isoformat()}: learning on held-out queries, {", ".join(conditions)}

### Command

```bash
{shlex.join(["python", "scripts/bench_learning.py", *argv[1:]])}
```

Machine: {os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), no GPU; load average {load:.1f}
at the end. Seeds {seeds}, horizons {horizons} SCORE steps, the shared cached cold start. Held-out: the 20
embedded held-out queries, {samples} samples each at the run's solver temperature, under the run's prompt and
budgets; grounded valid = closed, cited, every citation retrieved (the reward's a(r)). Δ: a run's card minus
the cold start's (same settings). Every cell is mean ± half-width of the 95% t-interval over seeds.

{text}

```
{chr(10).join(lines)}
```
"""
    page.parent.mkdir(parents=True, exist_ok=True)
    title = "" if page.is_file() else (f"# Study: learning on held-out queries ({page.stem})\n\nEach section below was "
                                       "appended by `scripts/bench_learning.py`; the index: [README.md](README.md).\n")
    with open(page, "a", encoding="utf-8") as fh:
        fh.write(title + section)
    print(f"appended to {page}")
