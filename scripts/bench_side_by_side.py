#!/usr/bin/env python
"""Several runs on one machine: the first SCORE steps of one run alone, then of N runs started together.

Each run is ``python src/train.py experiment=tiny_score trainer.max_steps=STEPS`` in its own process,
with ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` removed from its environment so that the trainer's own
thread logic (``threads.*``) decides. Prints wall times, each step's time (the trainer's
"SCORE step k done" line), the thread count each run logged, and the machine's load (``uptime``)
around each phase. A run that passes ``--timeout`` is killed and reported with the steps it finished.

    python scripts/bench_side_by_side.py                                      # alone, then 2 with threads.runs=2
    python scripts/bench_side_by_side.py --skip-alone --pair threads.runs=1 --timeout 300   # torch's default count
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEP = re.compile(r"SCORE step (\d+) done: .*\(([\d.]+)s\)")
THREADS = re.compile(r"CPU threads per process: (\d+)")


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def start(overrides: list[str], steps: int, out: Path) -> tuple[subprocess.Popen, Path]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env.update(HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore", TOKENIZERS_PARALLELISM="false")
    log = out.with_suffix(".log")
    cmd = [sys.executable, "src/train.py", "experiment=tiny_score", f"trainer.max_steps={steps}",
           "trainer.enable_progress_bar=false", f"paths.output_dir={out}", *overrides]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    return proc, log


def phase(name: str, n: int, overrides: list[str], steps: int, timeout: float, tmp: Path) -> list[str]:
    """Start ``n`` runs at once and wait for all (or the timeout); one result line per run."""
    before = uptime()
    t0 = time.time()
    runs = [start(overrides, steps, tmp / f"{name}_{i}") for i in range(n)]
    walls: list[float | None] = [None] * n
    while any(w is None for w in walls) and time.time() - t0 < timeout:
        for i, (proc, _) in enumerate(runs):
            if walls[i] is None and proc.poll() is not None:
                walls[i] = time.time() - t0
        time.sleep(0.5)
    for i, (proc, _) in enumerate(runs):
        if walls[i] is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    after = uptime()
    lines = [f"## {name}: {n} run(s), overrides {overrides or '(none)'}", f"  before: {before}"]
    for i, (proc, log) in enumerate(runs):
        text = log.read_text(errors="replace")
        step_s = [float(s) for _, s in STEP.findall(text)]
        threads = THREADS.search(text)
        done = f"{walls[i]:.1f} s wall, exit {proc.returncode}" if walls[i] is not None \
            else f"did not finish in {timeout:.0f} s"
        lines.append(f"  run {i}: {done}; threads {threads.group(1) if threads else '?'}; "
                     f"{len(step_s)}/{steps} steps: {', '.join(f'{s:.1f}' for s in step_s)} s "
                     f"(sum {sum(step_s):.1f} s)")
    lines.append(f"  after:  {after}")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--runs", type=int, default=2, help="runs started together in the second phase")
    p.add_argument("--alone", nargs="*", default=[], help="overrides of the run alone (default: none, auto threads)")
    p.add_argument("--pair", nargs="*", default=["threads.runs=2"], help="overrides of each side-by-side run")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per phase before its runs are killed")
    p.add_argument("--skip-alone", action="store_true")
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_side_by_side_"))
    try:
        out = [] if a.skip_alone else phase("alone", 1, a.alone, a.steps, a.timeout, tmp)
        out += phase("side by side", a.runs, a.pair, a.steps, a.timeout, tmp)
        print("\n".join(out))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
