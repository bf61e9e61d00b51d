"""Print a run's step-time split, throughput and peak memory from its TensorBoard events.

Usage: python scripts/summarize_run.py RUN_DIR [RUN_DIR ...]   (RUN_DIR = a paths.output_dir)
The first step is left out of the means (warm-up: allocator, kernels, engine start).
"""

from __future__ import annotations

import sys
from pathlib import Path
from statistics import mean

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

TAGS = ["time/rollout_s", "time/scoring_s", "time/update_s", "time/weight_sync_s", "throughput/tokens_per_s",
        "memory/peak_gpu_gib", "solver/reward_mean", "solver/entropy"]


def summarize(run: Path) -> dict[str, float]:
    values: dict[str, list[float]] = {}
    for events in sorted((run / "tensorboard").rglob("events.out.tfevents.*")):
        ea = EventAccumulator(str(events), size_guidance={"scalars": 0})
        ea.Reload()
        for tag in TAGS:
            if tag in ea.Tags()["scalars"]:
                values.setdefault(tag, []).extend(e.value for e in ea.Scalars(tag))
    out = {}
    for tag, vals in values.items():
        body = vals[1:] if len(vals) > 1 else vals
        out[tag] = max(vals) if tag.startswith("memory/") else mean(body)
    return out


def main(argv: list[str]) -> None:
    print("| run | rollout s | scoring s | update s | sync s | tokens/s | peak GPU GiB |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for arg in argv:
        s = summarize(Path(arg))
        f = lambda k: f"{s[k]:.2f}" if k in s else "-"  # noqa: E731
        print(f"| {Path(arg).name} | {f('time/rollout_s')} | {f('time/scoring_s')} | {f('time/update_s')} | "
              f"{f('time/weight_sync_s')} | {f('throughput/tokens_per_s')} | {f('memory/peak_gpu_gib')} |")


if __name__ == "__main__":
    main(sys.argv[1:])
