"""Draw a run's main curves (TensorBoard's "SCORE" custom-scalars page) to one PNG.

Usage: python scripts/plot_run.py RUN_DIR [--out docs/tiny_score_run.png] [--title TEXT] [--smoothing 0.6]
RUN_DIR is a run's ``paths.output_dir`` (e.g. ``logs/tiny_score/<time>``); the scalars come from its
TensorBoard event files, read with tensorboard's ``EventAccumulator``. The charts are the ones the
trainer registers as the "SCORE" page (``score_lightning.telemetry.loggers.SCORE_LAYOUT``), so the picture and
the page show the same tags. Each curve is drawn as its raw points (faint) under a smoothed line: TensorBoard's own
debiased exponential moving average (``--smoothing``, 0.6 as TensorBoard's slider; 0 draws the raw line), since at
8 trajectories a step a per-step reward is too noisy to show a trend. Needs matplotlib (``pip install -e ".[plot]"``).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from score_lightning.telemetry.loggers import SCORE_LAYOUT


def read_scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag under ``run/tensorboard`` (all event files, the cold start's included) as (step, value)."""
    out: dict[str, dict[int, float]] = {}
    files = sorted((run / "tensorboard").rglob("events.out.tfevents.*"))
    for events in files:
        ea = EventAccumulator(str(events), size_guidance={"scalars": 0})
        ea.Reload()
        for tag in ea.Tags()["scalars"]:
            for e in ea.Scalars(tag):
                out.setdefault(tag, {})[e.step] = e.value  # a resumed run rewrites a step: keep the last
    return {tag: sorted(points.items()) for tag, points in out.items()}


def smooth(values: list[float], weight: float) -> list[float]:
    """TensorBoard's scalar smoothing: an exponential moving average of weight ``weight`` on the previous value,
    debiased so the first points are not pulled toward 0 (``last / (1 - weight**n)``); NaNs are skipped."""
    out, last, n = [], 0.0, 0
    for v in values:
        if math.isfinite(v):
            last, n = last * weight + (1 - weight) * v, n + 1
        out.append(last / (1 - weight ** n) if n else math.nan)  # a NaN keeps the previous smoothed value
    return out


def plot(run: Path, out: Path, title: str | None = None, smoothing: float = 0.6) -> list[str]:
    """Write the PNG; return the charts drawn (a chart with none of its tags logged is left out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scalars = read_scalars(run)
    charts = [(name, [t for t in tags if t in scalars])
              for page in SCORE_LAYOUT.values() for name, tags in page.items()]
    charts = [(name, tags) for name, tags in charts if tags]
    if not charts:
        raise ValueError(f"no SCORE scalars under {run / 'tensorboard'}\n"
                         f"  RUN_DIR must be a run's paths.output_dir (it holds tensorboard/)")
    cols = 4 if len(charts) > 6 else 3
    rows = math.ceil(len(charts) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax, (name, tags) in zip(axes.flat, charts):
        for tag in tags:
            steps, values = zip(*scalars[tag])
            if smoothing > 0:
                raw = ax.plot(steps, values, marker="." if len(steps) < 60 else None, alpha=0.3, linewidth=0.8)
                ax.plot(steps, smooth(list(values), smoothing), color=raw[0].get_color(), label=tag)
            else:
                ax.plot(steps, values, marker="." if len(steps) < 60 else None, label=tag)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("SCORE step", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(charts):]:
        ax.set_visible(False)
    fig.suptitle(title or str(run), fontsize=11)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return [name for name, _ in charts]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, help="a run's paths.output_dir")
    ap.add_argument("--out", type=Path, default=Path("docs/tiny_score_run.png"))
    ap.add_argument("--title", default=None, help="figure title (default: the run folder)")
    ap.add_argument("--smoothing", type=float, default=0.6,
                    help="TensorBoard's smoothing weight in [0, 1): the line drawn over the raw points (0: raw only)")
    args = ap.parse_args(argv)
    if not 0 <= args.smoothing < 1:
        print(f"error: --smoothing={args.smoothing}: a weight in [0, 1) (TensorBoard's slider; 0 draws raw points only)",
              file=sys.stderr)
        return 2
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print('error: scripts/plot_run.py needs matplotlib\n  pip install -e ".[plot]"', file=sys.stderr)
        return 2
    try:
        drawn = plot(args.run, args.out, args.title, args.smoothing)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out} ({len(drawn)} charts: {', '.join(drawn)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
