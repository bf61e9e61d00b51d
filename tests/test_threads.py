"""CPU threads per process: the usable cores divided among local processes and side-by-side runs,
less the cores other work keeps busy, an explicit OMP_NUM_THREADS winning over auto, and the choice
logged once (with a warning when the machine is oversubscribed)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import compose
from score_lightning.launch import threads as T
from score_lightning.launch.threads import (LoadReading, apply_threads, local_processes, machine_load,
                                            own_load_share, plan_threads, usable_cores)

QUIET = LoadReading(0.0, 0.1, 64)


@pytest.fixture
def quiet_machine(monkeypatch):
    """apply_threads reads no real load: the tests that check its arithmetic must not depend on the machine."""
    monkeypatch.setattr(T, "machine_load", lambda: QUIET)


@pytest.mark.parametrize("cores, procs, runs, expected", [
    (2, 1, 1, 2),    # one run alone: every core it may use
    (2, 1, 2, 1),    # two runs side by side (threads.runs=2)
    (16, 4, 1, 4),   # four DDP ranks on 16 cores
    (16, 4, 2, 2),
    (2, 4, 1, 1),    # more processes than cores: never 0
    (7, 2, 1, 3),    # floor: 2 x 3 threads fit 7 cores
])
def test_auto_divides_the_cores_among_processes_and_runs(cores, procs, runs, expected):
    plan = plan_threads("auto", runs, procs, cores, {})
    assert plan.threads == expected
    assert plan.reason.startswith(f"threads.num=auto: {cores} usable cores / {procs} local process")


def test_the_users_omp_num_threads_wins_over_auto_but_not_over_an_explicit_count():
    plan = plan_threads("auto", 1, 1, 8, {"OMP_NUM_THREADS": "3"})
    assert plan.threads == 3 and plan.reason.startswith("OMP_NUM_THREADS=3 from the environment wins over threads.num=auto")
    assert "auto would give 8" in plan.reason
    assert plan_threads(2, 1, 1, 8, {"OMP_NUM_THREADS": "3"}).threads == 2
    # one this module exported for a parent process is not the user's: auto again
    assert plan_threads("auto", 2, 1, 8, {"OMP_NUM_THREADS": "8", T._MARK: "8"}).threads == 4
    assert plan_threads("auto", 1, 1, 8, {"OMP_NUM_THREADS": ""}).threads == 8


def test_local_processes_follow_the_launcher_then_the_config(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert local_processes(1, "single", "cpu") == 1
    assert local_processes(2, "ddp", "cpu") == 2
    assert local_processes("3", "fsdp", "cpu") == 3
    assert local_processes([0, 1], "ddp", "gpu") == 2
    assert local_processes("auto", "ddp", "cpu") == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert local_processes(1, "single", "cpu") == 4


def test_usable_cores_is_the_affinity_at_most(monkeypatch):
    n = usable_cores()
    assert 1 <= n <= len(os.sched_getaffinity(0))
    monkeypatch.setattr(T, "_cgroup_quota", lambda: 0.5)  # half a CPU still runs one thread
    assert usable_cores() == 1


def test_apply_sets_torch_and_the_environment_and_logs_once(monkeypatch, caplog, quiet_machine):
    for var in ("OMP_NUM_THREADS", "RAYON_NUM_THREADS", T._MARK, "LOCAL_WORLD_SIZE", "LOCAL_RANK", "RANK"):
        monkeypatch.setenv(var, "0")  # recorded first, so what apply_threads exports is undone after the test
        monkeypatch.delenv(var)
    monkeypatch.setattr(T, "usable_cores", lambda: 4)
    before = torch.get_num_threads()
    try:
        with caplog.at_level(logging.INFO, logger="score_lightning.launch.threads"):
            plan = apply_threads(compose(["threads.runs=2"]))
        assert plan.threads == 2 and torch.get_num_threads() == 2
        assert os.environ["OMP_NUM_THREADS"] == "2" and os.environ["RAYON_NUM_THREADS"] == "2"  # DDP ranks inherit
        lines = [r.getMessage() for r in caplog.records if r.name == "score_lightning.launch.threads"]
        assert lines == ["CPU threads per process: 2 (threads.num=auto: 4 usable cores / 1 local process / "
                         "threads.runs=2; other work needs 0.0 cores (run queue 0.0, 1-minute load average "
                         "0.10, over 64 CPUs))"]
        # a second run in the same process recomputes from its own config, not from the exported value
        assert apply_threads(compose(["threads.runs=4"])).threads == 1 and os.environ["OMP_NUM_THREADS"] == "1"
        monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's own: kept, and it wins over auto
        assert apply_threads(compose([])).threads == 3 and torch.get_num_threads() == 3
        assert apply_threads(compose(["threads.num=1"])).threads == 1 and os.environ["OMP_NUM_THREADS"] == "3"
    finally:
        torch.set_num_threads(before)


def test_bad_thread_settings_are_refused_by_name():
    from score_lightning.launch.config_validation import ConfigError, validate_config

    with pytest.raises(ConfigError) as err:
        validate_config(compose(["experiment=tiny_score", "threads.num=0", "threads.runs=many"]))
    assert "threads.num=0: allowed 'auto' or an integer >= 1" in str(err.value)
    assert "threads.runs='many': allowed an integer >= 1" in str(err.value)


@pytest.mark.parametrize("threads, trainer, worker", [(2, 1, 1), (3, 2, 1), (8, 4, 4), (1, 1, 1)])
def test_async_rollouts_split_the_threads_between_trainer_and_worker(threads, trainer, worker):
    assert T.split_for_worker(threads) == (trainer, worker)


def test_apply_under_async_gives_the_trainer_its_share_and_logs_both(monkeypatch, caplog, quiet_machine):
    for var in ("OMP_NUM_THREADS", "RAYON_NUM_THREADS", T._MARK, "LOCAL_WORLD_SIZE", "LOCAL_RANK", "RANK"):
        monkeypatch.setenv(var, "0")
        monkeypatch.delenv(var)
    monkeypatch.setattr(T, "usable_cores", lambda: 2)
    before = torch.get_num_threads()
    try:
        with caplog.at_level(logging.INFO, logger="score_lightning.launch.threads"):
            plan = apply_threads(compose(["rollout.mode=async"]))
        assert (plan.threads, plan.worker_threads) == (1, 1) and torch.get_num_threads() == 1
        assert [r.getMessage() for r in caplog.records if r.name == "score_lightning.launch.threads"] == [
            "CPU threads per process: 1 (threads.num=auto: 2 usable cores / 1 local process / threads.runs=1; "
            "other work needs 0.0 cores (run queue 0.0, 1-minute load average 0.10, over 64 CPUs); "
            "rollout.mode=async: trainer 1 + rollout worker 1 of 2)"]
        assert apply_threads(compose([])).worker_threads == 0  # sync: no worker, nothing withheld
        assert apply_threads(compose([])).threads == 2
    finally:
        torch.set_num_threads(before)


# ----------------------------------------------------------------------------- the machine's load


@pytest.mark.parametrize("runnable, load_avg, cores, procs, expected", [
    (0.0, 0.2, 2, 1, 2),  # a quiet machine: every core
    (1.0, 0.9, 2, 1, 1),  # one busy process: one core left
    (2.0, 2.0, 2, 1, 1),  # a busy process on each core: 1, never 0
    (5.0, 4.8, 2, 1, 1),  # issue 49: three jobs on 2 cores, load average 5
    (0.0, 3.0, 4, 1, 4),  # work that ended in the last minute still weighs in the load average: not counted
    (3.0, 0.1, 4, 1, 1),  # a job that just started counts through the run queue
    (4.0, 4.0, 16, 2, 6),  # 12 idle cores for 2 DDP ranks (Lightning starts them after the first one reads)
    (0.6, 0.0, 2, 1, 1),  # rounded to the nearest core: 1.4 idle is 1 ...
    (0.4, 0.0, 2, 1, 2),  # ... 1.6 is 2
])
def test_auto_takes_the_busy_cores_off_before_dividing(runnable, load_avg, cores, procs, expected):
    plan = plan_threads("auto", 1, procs, cores, {}, LoadReading(runnable, load_avg, cores))
    assert plan.threads == expected
    seen = f"other work needs {runnable:.1f} cores (run queue {runnable:.1f}, 1-minute load average {load_avg:.2f}"
    assert seen in plan.reason
    if expected < cores // procs:  # says why it chose fewer than the share
        assert f"so {expected} instead of {cores // procs}" in plan.reason


def test_the_load_reading_is_scaled_to_the_usable_cores_and_leaves_out_this_runs_ranks():
    # a 64-CPU host with 32 busy: a 4-core affinity mask sees 2 of its cores busy
    assert LoadReading(32.0, 30.0, 64).busy(4) == 2.0
    # torchrun starts every rank at once (LOCAL_RANK in each): the 3 siblings on the run queue are this run's
    plan = plan_threads("auto", 1, 4, 16, {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}, LoadReading(3.0, 0.5, 16))
    assert plan.threads == 4
    # an explicit count, the user's OMP_NUM_THREADS and a rank that inherited the launcher's choice ignore it
    busy = LoadReading(8.0, 8.0, 8)
    assert plan_threads(4, 1, 1, 8, {}, busy).threads == 4
    assert plan_threads("auto", 1, 1, 8, {"OMP_NUM_THREADS": "3"}, busy).threads == 3
    inherited = plan_threads("auto", 1, 2, 8, {"OMP_NUM_THREADS": "2", T._MARK: "2", "LOCAL_RANK": "1"}, busy)
    assert inherited.threads == 2 and "as the process that launched this rank chose it" in inherited.reason
    assert not T.auto_applies("auto", {"OMP_NUM_THREADS": "2", T._MARK: "2", "LOCAL_RANK": "1"})
    assert T.auto_applies("auto", {"OMP_NUM_THREADS": "2", T._MARK: "2"}) and not T.auto_applies(2, {})


def test_own_share_of_the_load_average():
    assert own_load_share(0.0, 10.0) == 0.0
    # busy all its life of 60 s: 1 - e^-1 of the minute's average
    assert abs(own_load_share(60.0, 60.0) - (1 - 2.718281828 ** -1)) < 1e-6
    assert own_load_share(5.0, 0.0) == 0.0


def test_oversubscription_warns():
    assert T.oversubscribed(LoadReading(0.0, 0.1, 2), 2, 2) is None
    assert T.oversubscribed(LoadReading(1.0, 1.0, 2), 2, 1) is None
    warning = T.oversubscribed(LoadReading(2.0, 2.1, 2), 2, 1)
    assert warning.startswith("the machine is oversubscribed: 2 usable cores, other work needs 2.0 cores")
    assert T.oversubscribed(None, 2, 8) is None


def _spinners(n: int) -> list[subprocess.Popen]:
    """``n`` processes that spin on a core each, started and seen running before this returns."""
    procs = [subprocess.Popen([sys.executable, "-S", "-c", "while True: pass"]) for _ in range(n)]
    deadline = time.time() + 20
    for p in procs:  # wait until each has run (its CPU time in /proc/<pid>/stat is above 0)
        while time.time() < deadline:
            fields = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[11]) + int(fields[12]) > 0:
                break
            time.sleep(0.05)
    return procs


@pytest.mark.skipif(not Path("/proc/loadavg").exists(), reason="reads the Linux run queue")
def test_a_busy_process_on_each_core_leaves_auto_one_thread_and_it_says_why(monkeypatch, caplog):
    for var in ("OMP_NUM_THREADS", "RAYON_NUM_THREADS", T._MARK, "LOCAL_WORLD_SIZE", "LOCAL_RANK", "RANK"):
        monkeypatch.setenv(var, "0")
        monkeypatch.delenv(var)
    cores = usable_cores()
    spinners = _spinners(cores)
    before = torch.get_num_threads()
    try:
        reading = machine_load()
        assert reading is not None and reading.runnable >= cores - 0.5, reading  # (the machine may be busier still)
        with caplog.at_level(logging.INFO, logger="score_lightning.launch.threads"):
            plan = apply_threads(compose([]))
    finally:
        for p in spinners:
            p.kill()
            p.wait()
        torch.set_num_threads(before)
    assert plan.threads == 1
    lines = [r.getMessage() for r in caplog.records if r.name == "score_lightning.launch.threads"]
    assert lines[0].startswith(f"CPU threads per process: 1 (threads.num=auto: {cores} usable core")
    assert "other work needs" in lines[0] and "run queue" in lines[0] and "1-minute load average" in lines[0]
    if cores > 1:
        assert f"so 1 instead of {cores}" in lines[0]
    assert lines[1].startswith(f"the machine is oversubscribed: {cores} usable core")
    assert [r.levelname for r in caplog.records if r.name == "score_lightning.launch.threads"] == ["INFO", "WARNING"]
