"""CPU threads per process: the usable cores divided among local processes and side-by-side runs,
less the cores other work keeps busy, an explicit OMP_NUM_THREADS winning over auto, and the choice
logged once (with a warning when the machine is oversubscribed)."""

from __future__ import annotations

import logging
import os
import signal
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

QUIET = LoadReading(0.0, 0.1, 64, 64)


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
                         "threads.runs=2; other work keeps 0.0 of the 64 allowed CPUs busy (1-minute load average "
                         "0.10 over 64 CPUs, not counted))"]
        # a second run in the same process recomputes from its own config, not from the exported value
        assert apply_threads(compose(["threads.runs=4"])).threads == 1 and os.environ["OMP_NUM_THREADS"] == "1"
        monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's own: kept, and it wins over auto
        assert apply_threads(compose([])).threads == 3 and torch.get_num_threads() == 3
        assert apply_threads(compose(["threads.num=1"])).threads == 1 and os.environ["OMP_NUM_THREADS"] == "3"
    finally:
        torch.set_num_threads(before)


def test_bad_thread_settings_are_refused_by_name():
    from helpers import refusal

    text = refusal(["experiment=tiny_score", "threads.num=0", "threads.runs=many", "threads.wait_policy=spin",
                    "callbacks.adaptive_threads.every_n_steps=-1", "callbacks.adaptive_threads.margin=0.5",
                    "callbacks.adaptive_threads.rise_after=0"])
    assert "threads.num=0: allowed 'auto' or an integer >= 1" in text
    assert "threads.runs=many: allowed an integer" in text
    assert "threads.wait_policy='spin': allowed one of: null, passive, active" in text
    assert "callbacks.adaptive_threads.every_n_steps=-1: allowed an integer >= 0" in text
    assert "callbacks.adaptive_threads.margin=0.5: allowed a number of cores in [0, 0.5)" in text
    assert "callbacks.adaptive_threads.rise_after=0: allowed an integer >= 1" in text


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
            "other work keeps 0.0 of the 64 allowed CPUs busy (1-minute load average 0.10 over 64 CPUs, not counted); "
            "rollout.mode=async: trainer 1 + rollout worker 1 of 2)"]
        assert apply_threads(compose([])).worker_threads == 0  # sync: no worker, nothing withheld
        assert apply_threads(compose([])).threads == 2
    finally:
        torch.set_num_threads(before)


# ----------------------------------------------------------------------------- the machine's load


@pytest.mark.parametrize("busy, load_avg, cores, procs, expected", [
    (0.0, 0.2, 2, 1, 2),  # a quiet machine: every core
    (1.0, 0.9, 2, 1, 1),  # one busy process: one core left
    (2.0, 2.0, 2, 1, 1),  # a busy process on each core: 1, never 0
    (0.0, 3.0, 4, 1, 4),  # work that ended in the last minute still weighs in the load average: not counted
    (3.0, 0.1, 4, 1, 1),  # a job that just started counts through the CPUs' busy time
    (4.0, 4.0, 16, 2, 6),  # 12 idle cores for 2 DDP ranks (Lightning starts them after the first one reads)
    (0.6, 0.0, 2, 1, 1),  # rounded to the nearest core: 1.4 idle is 1 ...
    (0.4, 0.0, 2, 1, 2),  # ... 1.6 is 2
])
def test_auto_takes_the_busy_cores_off_before_dividing(busy, load_avg, cores, procs, expected):
    plan = plan_threads("auto", 1, procs, cores, {}, LoadReading(busy, load_avg, cores, cores))
    assert plan.threads == expected
    seen = f"other work keeps {busy:.1f} of the {cores} allowed CPUs busy (1-minute load average {load_avg:.2f}"
    assert seen in plan.reason
    if expected < cores // procs:  # says why it chose fewer than the share
        assert f"so {expected} instead of {cores // procs}" in plan.reason


def test_the_load_reading_leaves_out_this_runs_ranks():
    # torchrun starts every rank at once (LOCAL_RANK in each): the 3 siblings keeping CPUs busy are this run's
    plan = plan_threads("auto", 1, 4, 16, {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}, LoadReading(3.0, 0.5, 16, 16))
    assert plan.threads == 4
    # an explicit count, the user's OMP_NUM_THREADS and a rank that inherited the launcher's choice ignore it
    busy = LoadReading(8.0, 8.0, 8, 8)
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
    assert T.oversubscribed(LoadReading(0.0, 0.1, 2, 2), 2, 2) is None
    assert T.oversubscribed(LoadReading(1.0, 1.0, 2, 2), 2, 1) is None
    warning = T.oversubscribed(LoadReading(2.0, 2.1, 2, 2), 2, 1)
    assert warning.startswith("the machine is oversubscribed: 2 usable cores, other work keeps 2.0 of the 2 allowed CPUs busy")
    assert T.oversubscribed(None, 2, 8) is None


def _spinners(n: int) -> list[int]:
    """The pids of ``n`` processes that spin on a core each, started and seen running before this returns. Each is
    started by a shell that exits at once, so it is no child of this process: the reading leaves this process's
    own children out (they are this run's work), and other work is what these stand for."""
    pids = []
    for _ in range(n):
        out = subprocess.run(["sh", "-c", f"'{sys.executable}' -S -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
                             capture_output=True, text=True, check=True)
        pids.append(int(out.stdout.strip()))
    deadline = time.time() + 20
    for pid in pids:  # wait until each has run (its CPU time in /proc/<pid>/stat is above 0)
        while time.time() < deadline:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[11]) + int(fields[12]) > 0:
                break
            time.sleep(0.05)
    return pids


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads the CPUs' busy time in Linux /proc/stat")
def test_a_busy_process_on_each_core_leaves_auto_one_thread_and_it_says_why(monkeypatch, caplog):
    for var in ("OMP_NUM_THREADS", "RAYON_NUM_THREADS", T._MARK, "LOCAL_WORLD_SIZE", "LOCAL_RANK", "RANK"):
        monkeypatch.setenv(var, "0")
        monkeypatch.delenv(var)
    cores = usable_cores()
    spinners = _spinners(cores)
    before = torch.get_num_threads()
    try:
        reading = machine_load()
        assert reading is not None and reading.busy >= cores - 0.5, reading  # (the machine may be busier still)
        with caplog.at_level(logging.INFO, logger="score_lightning.launch.threads"):
            plan = apply_threads(compose([]))
    finally:
        for pid in spinners:
            os.kill(pid, signal.SIGKILL)
        torch.set_num_threads(before)
    assert plan.threads == 1
    lines = [r.getMessage() for r in caplog.records if r.name == "score_lightning.launch.threads"]
    assert lines[0].startswith(f"CPU threads per process: 1 (threads.num=auto: {cores} usable core")
    assert "other work keeps" in lines[0] and "allowed CPU" in lines[0] and "1-minute load average" in lines[0]
    if cores > 1:
        assert f"so 1 instead of {cores}" in lines[0]
    assert lines[1].startswith(f"the machine is oversubscribed: {cores} usable core")
    assert [r.levelname for r in caplog.records if r.name == "score_lightning.launch.threads"] == ["INFO", "WARNING"]


# ----------------------------------------------------------------------------- the reading of this process's CPUs

STAT_BEFORE = """cpu  900 0 100 5000 0 0 0 0 0 0
cpu0 100 0 0 1000 5 0 0 0 0 0
cpu1 100 0 0 1000 5 0 0 0 0 0
cpu2 300 0 50 1000 0 0 0 0 0 0
cpu3 300 0 50 1000 0 0 0 0 0 0
intr 1 2 3
"""
# one second later (100 ticks a second): cpu0 50 user + 10 system busy (and 30 iowait: free), cpu1 30 user + 5 irq
# + 5 steal; cpu2 and cpu3 busy all the time, outside this process's CPUs
STAT_AFTER = """cpu  1200 0 200 5100 30 0 0 0 0 0
cpu0 150 0 10 1030 35 0 0 0 0 0
cpu1 130 0 0 1060 5 5 0 5 0 0
cpu2 400 0 50 1000 0 0 0 0 0 0
cpu3 400 0 50 1000 0 0 0 0 0 0
intr 1 2 3
"""


def test_the_reading_counts_only_the_allowed_cpus_less_this_process_tree():
    from score_lightning.host.cpu_load import CpuSample, busy_ticks, other_busy

    mine = frozenset({0, 1})
    assert busy_ticks(STAT_BEFORE, mine) == {0: 100, 1: 100}  # the "cpu" total line and cpu2-3 are not read
    assert busy_ticks(STAT_AFTER, mine) == {0: 160, 1: 140}  # user + system; user + irq + steal; iowait is free
    # 1.0 s busy on cpu0-1 in 1.0 s; this process ran 0.25 s and a rollout worker started meanwhile 0.05 s
    before = CpuSample(10.0, busy_ticks(STAT_BEFORE, mine), {100: 4.0})
    after = CpuSample(11.0, busy_ticks(STAT_AFTER, mine), {100: 4.25, 101: 0.05})
    assert other_busy(before, after, hz=100.0) == pytest.approx(0.7)  # (1.0 - 0.3) / 1.0
    # a process saturating both CPUs itself leaves no other work, whatever its threads
    assert other_busy(before, CpuSample(11.0, after.ticks, {100: 5.0}), hz=100.0) == 0.0
    # all four CPUs: cpu2 and cpu3 were busy 1.0 s each on top (never more than the CPUs read)
    every = frozenset(range(4))
    wide = other_busy(CpuSample(10.0, busy_ticks(STAT_BEFORE, every), {}),
                      CpuSample(11.0, busy_ticks(STAT_AFTER, every), {}), hz=100.0)
    assert wide == pytest.approx(3.0)
    assert other_busy(CpuSample(10.0, {0: 0}, {}), CpuSample(10.5, {0: 500}, {}), hz=100.0) == 1.0


def test_a_cpuset_beside_busy_cores_keeps_its_cores_and_a_quota_caps_them():
    # an idle 8-CPU cpuset of a 64-CPU host whose other cores are busy (load average 60): all 8 cores
    assert plan_threads("auto", 1, 1, 8, {}, LoadReading(0.0, 60.0, 8, 64)).threads == 8
    # a 2-CPU cgroup quota over all 64 CPUs: 32 of them busy still leave the quota's 2; 63 busy leave 1
    assert plan_threads("auto", 1, 1, 2, {}, LoadReading(32.0, 32.0, 64, 64)).threads == 2
    assert plan_threads("auto", 1, 1, 2, {}, LoadReading(63.0, 63.0, 64, 64)).threads == 1
    assert LoadReading(63.0, 63.0, 64, 64).free(2) == 1.0


_PINNED = """
import json, os, sys
sys.path.insert(0, "src")
cpu = int(sys.argv[1])
os.sched_setaffinity(0, {cpu})
from score_lightning.launch import threads as T
reading = T.machine_load()
plan = T.plan_threads("auto", 1, 1, T.usable_cores(), {}, reading)
print(json.dumps({"cores": T.usable_cores(), "cpus": reading.cpus, "busy": reading.busy, "threads": plan.threads,
                  "reason": plan.reason}))
"""


@pytest.mark.skipif(not Path("/proc/stat").exists() or not hasattr(os, "sched_setaffinity"), reason="Linux")
def test_a_process_pinned_to_one_cpu_reads_that_cpu_and_takes_one_thread():
    cpus = sorted(os.sched_getaffinity(0))
    spinner = None
    if len(cpus) > 1:  # the other CPU kept busy: a host-wide reading would see it, this one must not exceed its CPU
        spinner = subprocess.Popen([sys.executable, "-S", "-c", f"import os; os.sched_setaffinity(0, {{{cpus[1]}}})\n"
                                                                "while True: pass"])
    try:
        env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
        out = subprocess.run([sys.executable, "-c", _PINNED, str(cpus[0])], cwd=Path(__file__).resolve().parents[1],
                             env=env, capture_output=True, text=True, timeout=120)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    assert out.returncode == 0, out.stderr
    import json

    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert (seen["cores"], seen["cpus"], seen["threads"]) == (1, 1, 1)
    assert 0.0 <= seen["busy"] <= 1.0
    assert "of the 1 allowed CPU busy" in seen["reason"]


def test_the_wait_policy_is_exported_only_where_auto_decides_and_never_over_yours():
    env: dict[str, str] = {}
    assert T.export_wait_policy(compose([]), env) == "PASSIVE" and env == {"OMP_WAIT_POLICY": "PASSIVE"}
    mine = {"OMP_WAIT_POLICY": "active"}
    assert T.export_wait_policy(compose([]), mine) is None and mine == {"OMP_WAIT_POLICY": "active"}
    for overrides, env in ((["threads.num=2"], {}), ([], {"OMP_NUM_THREADS": "3"}), (["threads.wait_policy=null"], {})):
        assert T.export_wait_policy(compose(overrides), env) is None and "OMP_WAIT_POLICY" not in env


def test_the_plan_says_where_the_count_may_follow_the_load(monkeypatch, quiet_machine):
    for var in ("OMP_NUM_THREADS", "RAYON_NUM_THREADS", T._MARK, "LOCAL_WORLD_SIZE", "LOCAL_RANK", "RANK"):
        monkeypatch.setenv(var, "0")
        monkeypatch.delenv(var)
    monkeypatch.setattr(T, "usable_cores", lambda: 4)
    before = torch.get_num_threads()
    try:
        plan = apply_threads(compose(["threads.runs=2"]))
        assert (plan.adaptive, plan.cap, plan.cores) == (True, 2, 4)
        monkeypatch.delenv("OMP_NUM_THREADS")
        monkeypatch.delenv(T._MARK)
        assert apply_threads(compose(["rollout.mode=async"])).cap == 2  # the trainer's share of 4
        assert not apply_threads(compose(["threads.num=2"])).adaptive  # a fixed count stays fixed
        assert not apply_threads(compose(["strategy=ddp", "trainer.devices=2"])).adaptive  # several processes
        monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's own
        assert not apply_threads(compose([])).adaptive
    finally:
        torch.set_num_threads(before)
