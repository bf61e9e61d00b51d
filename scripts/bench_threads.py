#!/usr/bin/env python
"""A run under a busy machine: ``tiny_score`` alone, then with one, then two single-threaded busy processes
started after its first steps.

Each phase is ``python src/train.py experiment=tiny_score threads.num=auto`` in its own process, launched on a
quiet machine (so auto starts with every core), with ``OMP_NUM_THREADS``/``OMP_WAIT_POLICY`` removed from its
environment so that the trainer's own thread logic decides. Once ``--busy-after`` SCORE steps are done, the
phase's busy processes start (``python -c "while True: pass"``, each dying with this script); they run until the
phase ends. Each step's time is the trainer's "SCORE step k done ... (Xs)" line; a phase's figure is the median
of the steps from ``--busy-after`` on (the same steps in every phase), and each busy phase is given as a ratio to
the idle one. Thread changes the run logged ("CPU threads: a -> b (why)") are printed with each phase.

Goal (issue 69): one busy process at most 2x the idle step on 2 cores, two at most 3x. Run it on an otherwise
quiet machine: other work makes every figure meaningless. The last line is
``idle_step_s=... one_busy_ratio=... two_busy_ratio=...``.

    python scripts/bench_threads.py                      # 14 steps a phase, busy processes after step 3
    python scripts/bench_threads.py --steps 6 --busy-after 2 --set trainer.max_steps=6
"""

from __future__ import annotations

import argparse
import atexit
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEP = re.compile(r"SCORE step (\d+) done: .*\(([\d.]+)s\)")
LAUNCH = re.compile(r"CPU threads per process: (\d+)")
CHANGE = re.compile(r"CPU threads: (\d+) -> (\d+) \((.*)\)")
#: a busy single-threaded process that dies with the process that started it (PR_SET_PDEATHSIG = 1, SIGKILL)
SPIN = "import ctypes, os, sys\nctypes.CDLL(None).prctl(1, 9)\nif os.getppid() != int(sys.argv[1]): sys.exit()\n" \
       "while True: pass"
PHASES = (("idle", 0), ("one_busy", 1), ("two_busy", 2))

_children: list[subprocess.Popen] = []  # everything this script started and has not reaped yet
_groups: set[int] = set()  # those that lead their own process group (a training run and its workers)


def step_times(log_text: str) -> dict[int, float]:
    """Pure: SCORE step -> seconds, from a run's console log."""
    return {int(k): float(s) for k, s in STEP.findall(log_text)}


def phase_median(times: dict[int, float], first: int) -> float | None:
    """Pure: the median time of the steps from ``first`` on; None when the run finished none of them."""
    chosen = [s for k, s in times.items() if k >= first]
    return statistics.median(chosen) if chosen else None


def ratio(value: float | None, idle: float | None) -> float | None:
    return None if value is None or not idle else value / idle


def summary_line(idle: float | None, one: float | None, two: float | None) -> str:
    """Pure: the last line; ``nan`` for a figure the runs did not give."""
    def fmt(v: float | None) -> str:
        return "nan" if v is None else f"{v:.2f}"

    return f"idle_step_s={fmt(idle)} one_busy_ratio={fmt(ratio(one, idle))} two_busy_ratio={fmt(ratio(two, idle))}"


def start_spinners(n: int) -> list[subprocess.Popen]:
    """``n`` busy single-threaded processes; each is killed with this script, however it ends."""
    procs = [subprocess.Popen([sys.executable, "-S", "-c", SPIN, str(os.getpid())]) for _ in range(n)]
    _children.extend(procs)
    return procs


def stop(procs: list[subprocess.Popen]) -> None:
    """Kill ``procs`` (a training run with its whole process group) and reap them."""
    for p in procs:
        if p.poll() is None:
            try:
                if p.pid in _groups:
                    os.killpg(p.pid, signal.SIGKILL)
                else:
                    p.kill()
            except ProcessLookupError:
                pass
        p.wait()
        _groups.discard(p.pid)
        if p in _children:
            _children.remove(p)


def _stop_all() -> None:
    stop(list(_children))


def _on_signal(signum: int, frame: object) -> None:
    _stop_all()
    sys.exit(128 + signum)


def start_run(steps: int, overrides: list[str], out: Path) -> tuple[subprocess.Popen, Path]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY")}
    env.update(HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore", TOKENIZERS_PARALLELISM="false")
    log = out.with_suffix(".log")
    cmd = [sys.executable, "src/train.py", "experiment=tiny_score", "threads.num=auto", f"trainer.max_steps={steps}",
           "trainer.enable_progress_bar=false", f"paths.output_dir={out}", *overrides]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    _groups.add(proc.pid)
    _children.append(proc)
    return proc, log


def phase(name: str, busy: int, a: argparse.Namespace, tmp: Path) -> tuple[float | None, list[str]]:
    """One run; ``busy`` busy processes start once ``a.busy_after`` steps are done. (median, report lines)."""
    proc, log = start_run(a.steps, a.set, tmp / name)
    spinners: list[subprocess.Popen] = []
    t0 = time.time()
    try:
        while proc.poll() is None and time.time() - t0 < a.timeout:
            if busy and not spinners and len(step_times(log.read_text(errors="replace"))) >= a.busy_after:
                spinners = start_spinners(busy)
            time.sleep(0.2)
        timed_out = proc.poll() is None
    finally:
        stop(spinners + [proc])
    text = log.read_text(errors="replace")
    times = step_times(text)
    median = phase_median(times, a.busy_after)
    launch = LAUNCH.search(text)
    done = f"timed out after {a.timeout:.0f} s" if timed_out else f"exit {proc.returncode}"
    lines = [f"## {name}: {busy} busy process(es) after step {a.busy_after}; {done}; "
             f"launch threads {launch.group(1) if launch else '?'}",
             "  steps (s): " + ", ".join(f"{k}:{times[k]:.1f}" for k in sorted(times)),
             f"  median of steps >= {a.busy_after}: " + ("none finished" if median is None else f"{median:.2f} s")]
    lines += [f"  threads {old} -> {new}: {why}" for old, new, why in CHANGE.findall(text)]
    if proc.returncode not in (0, None) and not timed_out:
        lines.append("  log tail: " + " | ".join(text.strip().splitlines()[-5:]))
    return median, lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=14, help="SCORE steps per phase")
    p.add_argument("--busy-after", type=int, default=3, help="SCORE steps done before the busy processes start")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per phase before its run is killed")
    p.add_argument("--set", nargs="*", default=[], help="extra overrides of every run (key=value)")
    a = p.parse_args()
    if a.busy_after >= a.steps:
        p.error("--busy-after must be below --steps: the measured steps are those after it")
    atexit.register(_stop_all)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    medians: dict[str, float | None] = {}
    with tempfile.TemporaryDirectory(prefix="bench_threads_") as tmp:
        for name, busy in PHASES:
            medians[name], lines = phase(name, busy, a, Path(tmp))
            print("\n".join(lines), flush=True)
    idle, one, two = (medians[n] for n, _ in PHASES)
    for name, goal in (("one_busy", 2.0), ("two_busy", 3.0)):
        r = ratio(medians[name], idle)
        verdict = "not measured" if r is None else ("met" if r <= goal else "missed")
        print(f"goal {name} <= {goal:.0f}x idle: {verdict}" + ("" if r is None else f" ({r:.2f}x)"))
    print(summary_line(idle, one, two))


if __name__ == "__main__":
    main()
