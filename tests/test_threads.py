"""CPU threads per process: the usable cores divided among local processes and side-by-side runs,
an explicit OMP_NUM_THREADS winning over auto, and the choice logged once."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from helpers import compose
from score_lightning.launch import threads as T
from score_lightning.launch.threads import apply_threads, local_processes, plan_threads, usable_cores


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


def test_apply_sets_torch_and_the_environment_and_logs_once(monkeypatch, caplog):
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
                         "threads.runs=2)"]
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


def test_apply_under_async_gives_the_trainer_its_share_and_logs_both(monkeypatch, caplog):
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
            "rollout.mode=async: trainer 1 + rollout worker 1 of 2)"]
        assert apply_threads(compose([])).worker_threads == 0  # sync: no worker, nothing withheld
        assert apply_threads(compose([])).threads == 2
    finally:
        torch.set_num_threads(before)
