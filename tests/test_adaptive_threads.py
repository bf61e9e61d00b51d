"""A CPU run's thread count follows the load while it runs: the decision by hand (hysteresis included), and a real
run whose count changes mid-run, each change logged once with its reason."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch import Callback

from helpers import FAST, compose
from score_lightning.callbacks import adaptive_threads as A
from score_lightning.host.thread_control import free_cores, next_threads


@pytest.mark.parametrize("current, cap, free, expected", [
    (2, 2, [1.0], 1),         # one core taken: down at once
    (2, 2, [1.33], 1),        # a busy process got 2/3 of a core beside our 2 threads: 1.33 free rounds to 1
    (2, 2, [1.6], 2),         # 0.4 of a core taken: rounds to 2, stays
    (1, 2, [1.6, 1.6], 1),    # ... and from 1 it does not rise: 1.6 + 0.5 - 0.25 < 2 (the band)
    (1, 2, [1.8, 1.8], 2),    # free again in both readings: up
    (1, 2, [1.8], 1),         # one reading is not enough to rise
    (1, 2, [0.2, 1.9], 1),    # the last two readings must both leave room
    (1, 2, [0.0, 0.0], 1),    # never below 1
    (2, 8, [7.9, 7.9], 8),    # a rise may take several threads at once ...
    (4, 8, [8.0, 8.0], 8),
    (8, 8, [2.2], 2),         # ... and so may a drop
    (4, 2, [8.0, 8.0], 2),    # never above the cap (auto's share: threads.runs, local processes)
])
def test_the_decision_by_hand(current, cap, free, expected):
    assert next_threads(current, cap, free, margin=0.25, rise_after=2) == expected


def test_free_cores_respect_the_quota_and_the_workers_share():
    assert free_cores(usable=8, cpus=8, other=1.0) == 7.0
    assert free_cores(usable=2, cpus=64, other=32.0) == 2.0  # a cgroup quota of 2 on a half-busy 64-CPU host
    assert free_cores(usable=2, cpus=64, other=63.0) == 1.0
    assert free_cores(usable=4, cpus=4, other=1.0, reserved=2) == 1.0  # the rollout worker keeps its 2


def test_the_callback_stays_off_where_the_launch_plan_is_not_adaptive():
    fixed = SimpleNamespace(threads=2, adaptive=False, cap=2, cores=2, worker_threads=0)
    cb = A.AdaptiveThreads(every_n_steps=1, margin=0.25, rise_after=2, meter=_Replay([2.0]))
    cb.on_train_start(None, SimpleNamespace(thread_plan=fixed))
    assert not cb.active
    off = A.AdaptiveThreads(every_n_steps=0, margin=0.25, rise_after=2, meter=_Replay([2.0]))
    off.on_train_start(None, SimpleNamespace(thread_plan=SimpleNamespace(adaptive=True)))
    assert not off.active


class _Replay:
    """A meter that replays a load: the cores other work kept busy at each read."""

    def __init__(self, readings: list[float]) -> None:
        self.cpus = frozenset({0, 1})
        self.readings, self.reads = list(readings), 0

    def start(self) -> bool:
        return True

    def read(self) -> float | None:
        self.reads += 1
        return self.readings.pop(0) if self.readings else 0.0


class _Threads(Callback):
    """torch's thread count while each SCORE step ran."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.seen.append(torch.get_num_threads())


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_run_follows_the_load_and_logs_each_change_once(tmp_path, tiny_ckpt, monkeypatch):
    from score_lightning.launch import threads as T
    from score_lightning.launch.training import run

    for var in ("OMP_NUM_THREADS", "RAYON_NUM_THREADS", T._MARK, "LOCAL_WORLD_SIZE", "LOCAL_RANK", "RANK"):
        monkeypatch.setenv(var, "0")
        monkeypatch.delenv(var)
    monkeypatch.setattr(T, "usable_cores", lambda: 2)
    monkeypatch.setattr(T, "machine_load", lambda: T.LoadReading(0.0, 0.0, 2, 2))  # launched on a quiet machine
    # one busy process arrives during step 0 and keeps a core through step 1; it is gone from step 2 on
    meter = _Replay([1.0, 1.0, 0.0, 0.0])
    monkeypatch.setattr(A, "OtherWorkMeter", lambda: meter)  # the reading the config-built callback takes
    threads, lines, logger = _Threads(), _Lines(), logging.getLogger(A.__name__)
    level = logger.level
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)  # as the console shows it (Hydra's root level)
    before = torch.get_num_threads()
    cfg = compose(FAST + ["rollout=scripted", "solver.max_response_tokens=200", "evaluator.max_response_tokens=300",
                          "evaluator.max_rubric_tokens=160", "trainer.max_steps=5", f"paths.output_dir={tmp_path}"])
    try:
        run(cfg, extra_callbacks=[threads])
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)
        torch.set_num_threads(before)
    assert meter.reads == 4  # between the 5 steps
    assert threads.seen == [2, 1, 1, 1, 2]  # down after the first reading, up after two free readings in a row
    assert lines.lines == [
        "CPU threads: 2 -> 1 (other work kept 1.0 of the 2 allowed CPUs busy over the last SCORE step: 1.0 free core)",
        "CPU threads: 1 -> 2 (other work kept 0.0 of the 2 allowed CPUs busy over the last SCORE step: 2.0 free "
        "cores, at least 2.0 in each of the last 2 readings)",
    ]
