"""scripts/bench_threads.py: the step times it reads, its medians and ratios by hand, and busy processes that never
outlive it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import bench_threads  # noqa: E402

LOG = """[2026-01-01][score_lightning.launch.threads][INFO] - CPU threads per process: 2 (threads.num=auto: ...)
[..][score_lightning.module][INFO] - SCORE step 0 done: reward=0.100 valid=0.50 rubric_valid=1 consistency=0.500 tool_calls=1.00 (3.1s)
[..][score_lightning.module][INFO] - SCORE step 1 done: reward=0.100 valid=0.50 rubric_valid=1 consistency=nan tool_calls=1.00 (2.4s)
[..][score_lightning.module][INFO] - SCORE step 2 done: reward=0.100 valid=0.50 rubric_valid=1 consistency=0.500 tool_calls=1.00 (2.6s)
[..][score_lightning.callbacks.adaptive_threads][INFO] - CPU threads: 2 -> 1 (other work kept 1.0 of the 2 allowed CPUs busy)
[..][score_lightning.module][INFO] - SCORE step 3 done: reward=0.100 valid=0.50 rubric_valid=1 consistency=0.500 tool_calls=1.00 (9.0s)
[..][score_lightning.module][INFO] - SCORE step 4 done: reward=0.100 valid=0.50 rubric_valid=1 consistency=0.500 tool_calls=1.00 (3.5s)
[..][score_lightning.module][INFO] - SCORE step 5 done: reward=0.100 valid=0.50 rubric_valid=1 consistency=0.500 tool_calls=1.00 (3.3s)
"""


def test_step_times_medians_and_the_last_line_by_hand():
    times = bench_threads.step_times(LOG)
    assert times == {0: 3.1, 1: 2.4, 2: 2.6, 3: 9.0, 4: 3.5, 5: 3.3}
    assert bench_threads.phase_median(times, 3) == 3.5  # 9.0, 3.5, 3.3
    assert bench_threads.phase_median(times, 1) == 3.3  # 2.4 2.6 3.3 3.5 9.0
    assert bench_threads.phase_median({}, 3) is None
    assert bench_threads.CHANGE.findall(LOG) == [("2", "1", "other work kept 1.0 of the 2 allowed CPUs busy")]
    assert bench_threads.summary_line(2.5, 4.5, 7.0) == "idle_step_s=2.50 one_busy_ratio=1.80 two_busy_ratio=2.80"
    assert bench_threads.summary_line(2.5, None, 7.0) == "idle_step_s=2.50 one_busy_ratio=nan two_busy_ratio=2.80"
    assert bench_threads.summary_line(None, 4.5, 7.0) == "idle_step_s=nan one_busy_ratio=nan two_busy_ratio=nan"


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.time() + within_s
    while time.time() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":  # dead, waiting for its parent to reap it
            return True
        time.sleep(0.05)
    return False


def test_busy_processes_die_with_the_script_even_when_it_is_killed(tmp_path):
    pids = tmp_path / "pids"
    code = (f"import sys, time; sys.path.insert(0, {str(ROOT / 'scripts')!r}); import bench_threads\n"
            f"procs = bench_threads.start_spinners(2)\nopen({str(pids)!r}, 'w').write(' '.join(str(p.pid) for p in procs))\n"
            "time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.time() + 30
    while not (pids.exists() and pids.read_text().strip()) and time.time() < deadline:
        time.sleep(0.05)
    spinners = [int(p) for p in pids.read_text().split()]
    time.sleep(0.5)  # each has set its death signal
    os.kill(parent.pid, signal.SIGKILL)  # no atexit, no handler: only the death signal is left
    parent.wait()
    assert all(_gone(pid) for pid in spinners)


def test_the_script_stops_its_busy_processes_itself():
    procs = bench_threads.start_spinners(1)
    bench_threads.stop(procs)
    assert procs[0].poll() is not None and bench_threads._children == []
