"""The learning study as a picture (``scripts/bench_learning.py --figure PATH``).

Three panels: the training reward and its rubric-score part per SCORE step, each condition's mean over
seeds with a 95% t-band; and the held-out report card's change over the cold start per condition, mean
with a 95% t-interval over seeds. Reads only the cells' ``result.json`` contents (their curves and cards).
"""

from __future__ import annotations

import math
from pathlib import Path
from statistics import mean, stdev

PANELS = (("solver/reward_mean", "training reward R_s"), ("solver/reward_validity_part", "validity part a(r)"))
CARD_METRICS = (("grounded_valid", "grounded valid (sampled)"), ("format_valid", "format valid"),
                ("citation_precision", "citation precision"))
# a line style per condition as well as a colour: two conditions can repeat each other exactly (no_verifier is
# SCORE whenever the verifier never fires), and a solid line drawn under an identical one would vanish
LINE_STYLES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)))


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
         horizon: str, subject: str = "the embedded default") -> None:
    """``results``: the cells' ``result.json`` contents; their held-out cards at ``horizon`` steps are drawn, each as
    its change over its condition's cold-start card (``colds[condition]``).
    ``subject`` names the model in the title, so a figure of one study is not read as another's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conds = [c for c in conditions if any(r["condition"] == c for r in results)]
    seeds = sorted({r["seed"] for r in results})
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
    for j, c in enumerate(conds):
        rows = [r for r in results if r["condition"] == c]
        for i, (metric, _) in enumerate(CARD_METRICS):
            m, h = _interval([r["heldout"][horizon].get(metric, math.nan) - colds[c].get(metric, math.nan)
                              for r in rows], t975)
            ax.errorbar(i - 0.4 + width * (j + 0.5), m, yerr=h, fmt="o", color=colors[c], capsize=3,
                        label=c if i == 0 else None)
    ax.axhline(0.0, color="black", lw=0.8)
    ax.set_xticks(range(len(CARD_METRICS)), [name for _, name in CARD_METRICS])
    ax.set_title(f"held-out card after {horizon} steps: Δ over the cold start")
    ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"Learning on {subject}: {len(seeds)} seeds ({', '.join(map(str, seeds))}); "
                 "lines and points are means, bands and bars 95% t-intervals over seeds", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
