"""The learning study as a picture (``scripts/bench_learning.py --figure PATH``).

Three panels: the training reward and its rubric-score part per SCORE step, each condition's mean over
seeds with a 95% t-band; and the held-out report card's change over the cold start per condition, mean
with a 95% t-interval over seeds. Reads only the cells' ``result.json`` contents (their curves and cards).

A table of many conditions (the relatives) would drown in overlapping bands, so past ``MANY`` conditions the
figure is a forest instead: one row per condition, its change over its own cold start and its paired (same
seed) difference against one arm, each with its 95% t-interval, beside its seconds per step and its smoothed
training reward.
"""

from __future__ import annotations

import math
from pathlib import Path
from statistics import mean, stdev

from study_report import delta, paired

PANELS = (("solver/reward_mean", "training reward R_s"), ("solver/reward_validity_part", "validity part a(r)"))
CARD_METRICS = (("grounded_valid", "grounded valid\n(sampled)"), ("format_valid", "format\nvalid"),
                ("citation_precision", "citation\nprecision"), ("item_recall", "item\nrecall"))
# a line style per condition as well as a colour: two conditions can repeat each other exactly (no_verifier is
# SCORE whenever the verifier never fires), and a solid line drawn under an identical one would vanish
LINE_STYLES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)))
#: past this many conditions the figure is a forest (``draw_forest``)
MANY = 6
#: the forest's reward curves: a trailing mean over this many steps, as one step's mean of 8 reports is noise
SMOOTH = 10


def _band(series: list[list[float]], t975: dict[int, float]) -> tuple[list[float], list[float], list[float]]:
    """Per step: mean and the 95% t-interval over the seeds that have that step (finite values only)."""
    steps = max((len(s) for s in series), default=0)
    mid, lo, hi = [], [], []
    for i in range(steps):
        vals = [s[i] for s in series if i < len(s) and math.isfinite(s[i])]
        m = mean(vals) if vals else math.nan
        h = t975.get(len(vals) - 1, 1.96) * stdev(vals) / math.sqrt(len(vals)) if len(vals) > 1 else 0.0
        mid.append(m)
        lo.append(m - h)
        hi.append(m + h)
    return mid, lo, hi


def _interval(vals: list[float], t975: dict[int, float]) -> tuple[float, float]:
    vals = [v for v in vals if math.isfinite(v)]
    if not vals:
        return math.nan, math.nan
    h = t975.get(len(vals) - 1, 1.96) * stdev(vals) / math.sqrt(len(vals)) if len(vals) > 1 else 0.0
    return mean(vals), h


def draw(results: list[dict], colds: dict[str, dict], conditions: list[str], out: Path, t975: dict[int, float],
         horizon: str, subject: str = "the embedded default", against: str | None = None) -> None:
    """``results``: the cells' ``result.json`` contents; their held-out cards at ``horizon`` steps are drawn, each as
    its change over its condition's cold-start card (``colds[condition]``).
    ``subject`` names the model in the title, so a figure of one study is not read as another's; ``against``
    is the arm a forest's paired differences are taken against."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conds = [c for c in conditions if any(r["condition"] == c for r in results)]
    seeds = sorted({r["seed"] for r in results})
    if len(conds) > MANY:
        return draw_forest(results, colds, conds, out, t975, horizon, subject, against)
    colors = {c: plt.get_cmap("tab10")(i) for i, c in enumerate(conds)}
    styles = {c: LINE_STYLES[i % len(LINE_STYLES)] for i, c in enumerate(conds)}
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    for ax, (tag, title) in zip(axes[:2], PANELS):
        for c in conds:
            series = [r["train"].get("curves", {}).get(tag, []) for r in results if r["condition"] == c]
            mid, lo, hi = _band(series, t975)
            x = list(range(len(mid)))
            ax.plot(x, mid, color=colors[c], ls=styles[c], label=c, lw=1.6)
            ax.fill_between(x, lo, hi, color=colors[c], alpha=0.15, lw=0)
        ax.set_title(title)
        ax.set_xlabel("SCORE step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="lower right")
    ax = axes[2]
    width = 0.8 / max(1, len(conds))
    metrics = card_metrics(results, colds, horizon)
    for j, c in enumerate(conds):
        rows = [r for r in results if r["condition"] == c]
        for i, (metric, _) in enumerate(metrics):
            m, h = _interval([r["heldout"][horizon].get(metric, math.nan) - colds[c].get(metric, math.nan)
                              for r in rows], t975)
            ax.errorbar(i - 0.4 + width * (j + 0.5), m, yerr=h, fmt="o", color=colors[c], capsize=3,
                        label=c if i == 0 else None)
    ax.axhline(0.0, color="black", lw=0.8)
    ax.set_xticks(range(len(metrics)), [name for _, name in metrics])
    ax.set_title(f"held-out card after {horizon} steps: Δ over the cold start")
    ax.grid(alpha=0.3, axis="y")
    _save(fig, out, f"Learning on {subject}: {len(seeds)} seeds ({', '.join(map(str, seeds))}); "
          "lines and points are means, bands and bars 95% t-intervals over seeds")


def card_metrics(results: list[dict], colds: dict[str, dict], horizon: str) -> tuple[tuple[str, str], ...]:
    """The card metrics both a cell and its cold start carry: cards made before ``item_recall`` existed (the
    earlier studies) keep their three columns instead of an empty fourth."""
    return tuple((m, name) for m, name in CARD_METRICS
                 if any(m in r["heldout"].get(horizon, {}) and m in colds.get(r["condition"], {}) for r in results))


def smoothed(values: list[float], window: int = SMOOTH) -> list[float]:
    """Trailing mean over the last ``window`` finite values (fewer at the start)."""
    out = []
    for i in range(len(values)):
        tail = [v for v in values[max(0, i - window + 1):i + 1] if math.isfinite(v)]
        out.append(mean(tail) if tail else math.nan)
    return out


def forest_rows(results: list[dict], colds: dict[str, dict], conds: list[str], horizon: str, t975: dict[int, float],
                against: str | None, metric: str = "grounded_valid") -> list[dict]:
    """Per condition: its change over its own cold start at ``horizon`` (mean, half-width), the paired same-seed
    difference of that change against ``against`` (NaN where there is no such arm or no shared seed), and the
    mean seconds per step."""
    def change(r: dict) -> float:
        return delta(r, colds[r["condition"]], horizon, metric)

    rows = []
    for c in conds:
        cells = [r for r in results if r["condition"] == c]
        diffs = paired(results, c, against, change) if against and c != against else []
        secs = [r["train"].get("seconds_per_step", math.nan) for r in cells]
        rows.append({"condition": c, "delta": _interval([change(r) for r in cells], t975),
                     "paired": _interval(diffs, t975) if diffs else (math.nan, math.nan),
                     "seconds": _interval(secs, t975), "seeds": len(cells)})
    return rows


def draw_forest(results: list[dict], colds: dict[str, dict], conds: list[str], out: Path, t975: dict[int, float],
                horizon: str, subject: str, against: str | None) -> None:
    """Four panels, one row per condition in each: Δ held-out grounded validity over its own cold start, the
    paired difference against ``against``, seconds per step (each mean ± 95% t-interval over seeds), and the
    training reward, smoothed, one line per condition."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = sorted({r["seed"] for r in results})
    rows = forest_rows(results, colds, conds, horizon, t975, against)
    cmap = plt.get_cmap("tab20")
    colors = {c: cmap(i % 20) for i, c in enumerate(conds)}
    y = list(range(len(conds)))[::-1]  # the first condition on top
    fig, axes = plt.subplots(1, 4, figsize=(19, 0.42 * len(conds) + 2.2),
                             gridspec_kw={"width_ratios": [1.1, 1.1, 0.8, 1.4]})
    panels = ((axes[0], "delta", f"Δ held-out grounded valid @{horizon}\nover its own cold start"),
              (axes[1], "paired", f"paired Δ − {against}\n(same seed)" if against else "paired (no --against arm)"),
              (axes[2], "seconds", "seconds per step"))
    for ax, key, title in panels:
        for yi, row in zip(y, rows):
            m, h = row[key]
            if math.isfinite(m):
                ax.errorbar(m, yi, xerr=h if math.isfinite(h) else None, fmt="o", color=colors[row["condition"]],
                            capsize=3)
        if key != "seconds":
            ax.axvline(0.0, color="black", lw=0.8)
        ax.set_yticks(y, [f"{r['condition']} ({r['seeds']})" for r in rows] if ax is axes[0] else [])
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3, axis="x")
    ax = axes[3]
    for i, c in enumerate(conds):
        series = [r["train"].get("curves", {}).get("solver/reward_mean", []) for r in results if r["condition"] == c]
        mid, _, _ = _band(series, t975)
        ax.plot(range(len(mid)), smoothed(mid), color=colors[c], ls=LINE_STYLES[i % len(LINE_STYLES)], lw=1.3, label=c)
    ax.set_title(f"training reward, each method's own (a scale per method), mean over seeds,\n"
                 f"trailing mean of {SMOOTH} steps", fontsize=10)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    _save(fig, out, f"Learning on {subject}: {len(seeds)} seeds ({', '.join(map(str, seeds))}); points are means, "
          "bars 95% t-intervals over seeds (seeds per condition in brackets)")


def _save(fig, out: Path, title: str) -> None:
    """Title, lay out, write the PNG and free the figure."""
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
