"""Does the embedded default learn? ``tiny_score`` with 2 seeds against a frozen-solver control.

    python scripts/bench_learning.py [--seeds 0 1] [--steps N] [--out logs/bench_learning] [--no-append]

Each seed runs ``experiment=tiny_score`` (cold-start SFT, cached after the first run, then SCORE)
and the same with ``solver.freeze=true``. From each run's TensorBoard events it reports the solver
reward over the first and last 20% of steps, rubric validity / answer validity / verified rate at
the first RL step, and entropy at the start and end; then appends a dated table to
``docs/BENCHMARKS.md`` with the exact command.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from statistics import mean

ROOT = Path(__file__).resolve().parents[1]


def _tb_scalars(logdir: Path) -> dict[str, dict[int, float]]:
    """``{tag: {step: value}}`` from the event files directly in ``logdir`` (not its subfolders)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, dict[int, float]] = {}
    for events in sorted(logdir.glob("events.out.tfevents.*")):
        ea = EventAccumulator(str(events), size_guidance={"scalars": 0})
        ea.Reload()
        for tag in ea.Tags()["scalars"]:
            out.setdefault(tag, {}).update({e.step: e.value for e in ea.Scalars(tag)})
    return out


def read_scalars(run: Path) -> dict[str, list[float]]:
    """The RL curves, in step order (the cold start logs to ``tensorboard/sft``, read separately)."""
    return {tag: [v for _, v in sorted(steps.items())] for tag, steps in _tb_scalars(run / "tensorboard").items()}


def read_sft_probe(run: Path) -> dict[str, float]:
    """The cold start's ``sft/summary/*`` values (probe rates over 16 rubrics and 8 rollouts, loss, time)."""
    return {tag[len("sft/summary/"):]: steps[max(steps)] for tag, steps in _tb_scalars(run / "tensorboard" / "sft").items()
            if tag.startswith("sft/summary/")}


def summarize(scalars: dict[str, list[float]]) -> dict[str, float]:
    reward = scalars["solver/reward_mean"]
    n = max(1, round(0.2 * len(reward)))
    ent = scalars.get("solver/entropy", [float("nan")])
    return {
        "steps": len(reward),
        "reward_first20": mean(reward[:n]),
        "reward_last20": mean(reward[-n:]),
        "reward_gain": mean(reward[-n:]) - mean(reward[:n]),
        "rubric_valid_first": scalars["evaluator/rubric_valid_rate"][0],
        "answer_valid_first": scalars["solver/answer_valid_rate"][0],
        "answer_valid_first20": mean(scalars["solver/answer_valid_rate"][:n]),
        "answer_valid_last20": mean(scalars["solver/answer_valid_rate"][-n:]),
        "verified_first": scalars["evaluator/verified_rate"][0],
        "entropy_start": ent[0],
        "entropy_end": ent[-1],
    }


def run_one(seed: int, freeze: bool, steps: int | None, out: Path, extra: list[str]) -> tuple[Path, float]:
    run_dir = out / f"seed{seed}{'-frozen' if freeze else ''}"
    cmd = [sys.executable, "src/train.py", "experiment=tiny_score", f"seed={seed}", f"paths.output_dir={run_dir}",
           "trainer.enable_progress_bar=false", *extra]
    if freeze:
        cmd.append("solver.freeze=true")
    if steps:
        cmd.append(f"trainer.max_steps={steps}")
    print("$", shlex.join(cmd), flush=True)
    t0 = time.time()
    subprocess.run(cmd, cwd=ROOT, check=True, env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    return run_dir, time.time() - t0


def _f(x: float, fmt: str = ".2f") -> str:
    return "-" if x != x else format(x, fmt)  # NaN (no solver update: no entropy logged) -> "-"


def table(rows: list[tuple[str, dict[str, float], float]]) -> str:
    head = ("| run | steps | reward first 20% | reward last 20% | gain | rubric valid @1 | answer valid @1 "
            "| verified @1 | answer valid first → last 20% | entropy start → end | wall s |\n" + "|---" * 11 + "|\n")
    body = "".join(
        f"| {name} | {s['steps']} | {s['reward_first20']:.3f} | {s['reward_last20']:.3f} | {s['reward_gain']:+.3f} | "
        f"{s['rubric_valid_first']:.2f} | {s['answer_valid_first']:.2f} | {s['verified_first']:.2f} | "
        f"{s['answer_valid_first20']:.2f} → {s['answer_valid_last20']:.2f} | "
        f"{_f(s['entropy_start'])} → {_f(s['entropy_end'])} | {wall:.0f} |\n"
        for name, s, wall in rows
    )
    return head + body


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--steps", type=int, default=None, help="override trainer.max_steps (default: the experiment's)")
    ap.add_argument("--out", type=Path, default=ROOT / "logs" / "bench_learning")
    ap.add_argument("--no-append", action="store_true", help="print only; do not append to docs/BENCHMARKS.md")
    ap.add_argument("extra", nargs="*", help="extra Hydra overrides for every run")
    args = ap.parse_args()
    rows, verdicts, probe = [], [], {}
    for seed in args.seeds:
        learn_dir, t_learn = run_one(seed, False, args.steps, args.out, args.extra)
        frozen_dir, t_frozen = run_one(seed, True, args.steps, args.out, args.extra)
        s_learn, s_frozen = summarize(read_scalars(learn_dir)), summarize(read_scalars(frozen_dir))
        rows += [(f"seed {seed}", s_learn, t_learn), (f"seed {seed}, solver frozen", s_frozen, t_frozen)]
        ok = s_learn["reward_gain"] > 0 and s_learn["reward_gain"] > s_frozen["reward_gain"]
        verdicts.append(f"seed {seed}: gain {s_learn['reward_gain']:+.3f} vs frozen {s_frozen['reward_gain']:+.3f} "
                        f"-> {'learns' if ok else 'NO LEARNING SIGNAL'}; rubric valid at the first RL step "
                        f"{s_learn['rubric_valid_first']:.2f} ({'ok' if s_learn['rubric_valid_first'] >= 0.8 else 'BELOW 0.8'})")
        if not probe:
            probe = read_sft_probe(learn_dir)
    text = table(rows)
    if probe:  # one rubric per SCORE step, so "@1" above is 0 or 1; the probe samples 16 at once
        keys = [k for k in ("probe/rubric_valid_rate", "probe/answer_valid_rate", "probe/cited_rate",
                            "probe/tool_calls_mean", "total_s", "steps", "loss", "token_acc") if k in probe]
        text += ("\nCold start (SFT, shared by every run; `sft/summary/*`): "
                 + ", ".join(f"{k} {probe[k]:.3g}" for k in keys) + ".\n")
    print(text)
    print("\n".join(verdicts))
    if not args.no_append:
        cmd = "python scripts/bench_learning.py " + " ".join(sys.argv[1:])
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                   platform.processor())
        section = (f"\n## Learning curve of `experiment=tiny_score` ({dt.date.today().isoformat()})\n\n"
                   f"Command: `{cmd.strip()}`  \nMachine: {os.cpu_count()} CPU cores ({cpu}), "
                   f"Python {platform.python_version()}.\n\n{text}\n" + "".join(f"- {v}\n" for v in verdicts))
        bench = ROOT / "docs" / "BENCHMARKS.md"
        with open(bench, "a", encoding="utf-8") as fh:
            fh.write(section)
        print(f"appended to {bench}")


if __name__ == "__main__":
    main()
