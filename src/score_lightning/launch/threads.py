"""CPU threads per training process: the cores this process may use, shared among the processes
that run on them, so that runs and ranks do not oversubscribe the machine.

Why: torch starts one intra-op thread per core in every process. Two processes on two cores then
run four spinning OpenMP threads, and a tiny-model SCORE step that takes ~3 s alone took 100-290 s
(NOTES.md). Lightning divides the cores among DDP processes only when it launches them itself, and
never for one process, and no process can see an independent run started beside it: that is what
``threads.runs`` (or ``OMP_NUM_THREADS=1``) tells it.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

#: set beside OMP_NUM_THREADS when this module chose the count, so that child processes (DDP ranks,
#: which inherit the environment) do not mistake it for the user's own setting
_MARK = "SCORE_LIGHTNING_THREADS"


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity, capped by a cgroup CPU quota (containers)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, min(cores, math.ceil(quota)) if quota else cores)


def _cgroup_quota() -> float | None:
    """CPUs allowed by cgroup v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us``; None when unlimited or unknown."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class ThreadPlan:
    """How many threads, and why (the log line). ``worker_threads``: the asynchronous rollout worker's
    share (``rollout.mode=async``; 0 when there is no worker)."""

    threads: int
    reason: str
    worker_threads: int = 0


def split_for_worker(threads: int) -> tuple[int, int]:
    """(trainer, worker) threads out of ``threads`` for ``rollout.mode=async``: the worker generates while
    the trainer updates, so together they must not ask for more cores than one process had (2 -> 1 + 1,
    3 -> 2 + 1). With a single thread both keep one: two threads in all (the log line says so)."""
    worker = max(1, threads // 2)
    return max(1, threads - worker), worker


def with_worker(plan: ThreadPlan) -> ThreadPlan:
    """``plan`` split between the trainer and the rollout worker (:func:`split_for_worker`)."""
    trainer, worker = split_for_worker(plan.threads)
    share = " (each keeps 1: 2 threads in all)" if plan.threads == 1 else ""
    return ThreadPlan(trainer, f"{plan.reason}; rollout.mode=async: trainer {trainer} + rollout worker {worker} "
                               f"of {plan.threads}{share}", worker)


def plan_threads(setting: object, runs: int, local_processes: int, cores: int, env: dict[str, str]) -> ThreadPlan:
    """Pure: the thread count for ``threads.num`` = ``setting`` ("auto" or N).

    Precedence: an explicit ``threads.num=N``; then ``OMP_NUM_THREADS`` from the environment (the
    user's own, not one this module set for a parent process); then auto = cores / (local processes
    x runs), at least 1.
    """
    auto = max(1, cores // max(1, local_processes * runs))
    why_auto = (f"{cores} usable core{'s' * (cores != 1)} / {local_processes} local "
                f"process{'es' * (local_processes != 1)} / threads.runs={runs}")
    if setting != "auto":
        return ThreadPlan(int(setting), f"threads.num={setting} (auto would give {auto}: {why_auto})")
    omp = env.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) > 0 and env.get(_MARK) != omp:  # not one this module exported earlier
        return ThreadPlan(int(omp), f"OMP_NUM_THREADS={omp} from the environment wins over threads.num=auto "
                                    f"(auto would give {auto}: {why_auto})")
    return ThreadPlan(auto, f"threads.num=auto: {why_auto}")


def local_processes(devices: object, strategy: str, accelerator: str) -> int:
    """Training processes on this machine: ``LOCAL_WORLD_SIZE`` (torchrun, SLURM launchers) if set,
    else ``trainer.devices`` under ddp/fsdp (Lightning starts one process per device), else 1."""
    env = os.environ.get("LOCAL_WORLD_SIZE", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    if strategy not in ("ddp", "fsdp"):
        return 1
    if isinstance(devices, (list, tuple)):
        return max(1, len(devices))
    if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
        devices = int(devices)
    if isinstance(devices, int) and devices > 0:
        return devices
    if accelerator != "cpu":  # "auto" / -1 on GPUs: every visible device
        import torch

        return max(1, torch.cuda.device_count())
    return 1


def apply_threads(cfg) -> ThreadPlan:
    """Set torch's intra-op threads for this run (``threads.*``, configs/train.yaml) and log it once.

    ``OMP_NUM_THREADS`` and ``RAYON_NUM_THREADS`` (the tokenizers' pool) are exported too when
    unset: DDP ranks inherit the count, and Lightning, which only sets threads when
    ``OMP_NUM_THREADS`` is unset, leaves it alone.
    """
    import torch
    from omegaconf import ListConfig, OmegaConf

    t = cfg.get("threads") or {}
    devices = OmegaConf.select(cfg, "trainer.devices")
    devices = list(devices) if isinstance(devices, ListConfig) else devices
    procs = local_processes(devices, str(OmegaConf.select(cfg, "strategy.name")),
                            str(OmegaConf.select(cfg, "trainer.accelerator")))
    plan = plan_threads(t.get("num", "auto"), int(t.get("runs", 1)), procs, usable_cores(), dict(os.environ))
    if str(OmegaConf.select(cfg, "rollout.mode") or "sync") == "async":
        plan = with_worker(plan)
    torch.set_num_threads(plan.threads)
    ours = os.environ.get(_MARK)
    if os.environ.get("RAYON_NUM_THREADS") in (None, ours):
        os.environ["RAYON_NUM_THREADS"] = str(plan.threads)
    if os.environ.get("OMP_NUM_THREADS") in (None, ours):  # never overwrite the user's own
        os.environ["OMP_NUM_THREADS"] = os.environ[_MARK] = str(plan.threads)
    if os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("RANK", "0") == "0":
        log.info("CPU threads per process: %d (%s)", plan.threads, plan.reason)
    return plan
