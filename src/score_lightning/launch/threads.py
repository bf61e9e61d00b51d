"""CPU threads per training process: the cores this process may use, shared among the processes
that run on them, so that runs and ranks do not oversubscribe the machine.

Why: torch starts one intra-op thread per core in every process. Two processes on two cores then
run four spinning OpenMP threads, and a tiny-model SCORE step that takes ~3 s alone took 100-290 s
(NOTES.md). Lightning divides the cores among DDP processes only when it launches them itself, and
never for one process, and no process can see an independent run started beside it: that is what
``threads.runs`` (or ``OMP_NUM_THREADS=1``) tells it.

``auto`` also looks at the load already on the machine (issue 49: with three other jobs on 2 cores, 2
threads took 45-52 s a step and 1 thread 11.4 s): the cores other work keeps busy on this process's own CPUs
over 0.2 s (``host/cpu_load.py``: per-CPU busy time less this process's, its sibling ranks left out) are
taken off the usable cores before they are divided. Work on CPUs outside the affinity mask is not read at all
(a host-wide reading scaled to a share gave 1 thread on an idle 8-core cpuset, issue 69); under a cgroup quota
the usable cores are the quota or the CPUs other work leaves idle, whichever is fewer. The 1-minute load
average is logged beside it but not counted: it lags, so a run started right after other work ended (the next
cell of a study, a test suite's next CLI run, a script started after a build) would see that work for a minute
and keep one thread for its whole life on an idle machine. It logs what it saw and chose, and warns when the
machine is oversubscribed. On a CPU run of one process the count then follows the load while it runs
(``callbacks/adaptive_threads.py``); ``OMP_WAIT_POLICY=PASSIVE`` (``threads.wait_policy``) keeps idle OpenMP
threads from spinning on cores other work needs.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import MutableMapping
from dataclasses import dataclass, replace
from pathlib import Path

from score_lightning.host.cpu_load import OtherWorkMeter

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
class LoadReading:
    """What else keeps this process's CPUs busy: ``busy`` (cores of its ``cpus`` allowed CPUs that other work kept
    busy over the reading, ``host/cpu_load.py``) and, logged only, ``load_avg`` (the host's 1-minute load average
    less this process's own share, over ``online`` CPUs)."""

    busy: float
    load_avg: float
    cpus: int
    online: int

    def others(self, siblings: int = 0) -> float:
        """Cores other work keeps busy, less this run's ``siblings`` (its other local processes, started with it)."""
        return max(0.0, self.busy - siblings)

    def free(self, cores: int, siblings: int = 0) -> float:
        """Cores this process may use that other work leaves idle: its ``cores`` (affinity, cgroup quota) or its
        allowed CPUs less the busy ones, whichever is fewer. Never scaled: the reading is of its own CPUs."""
        return max(0.0, min(float(cores), self.cpus - self.others(siblings)))

    def describe(self, siblings: int = 0) -> str:
        return (f"other work keeps {self.others(siblings):.1f} of the {self.cpus} allowed "
                f"CPU{'s' * (self.cpus != 1)} busy (1-minute load average {self.load_avg:.2f} over {self.online} "
                "CPUs, not counted)")


def own_load_share(cpu_seconds: float, elapsed_seconds: float) -> float:
    """This process's contribution to the 1-minute load average: the share of its life it was running (its CPU
    time over its age, at most 1 per thread it ran), weighted by how much of the average's minute it has lived."""
    if elapsed_seconds <= 0:
        return 0.0
    return (cpu_seconds / elapsed_seconds) * (1.0 - math.exp(-elapsed_seconds / 60.0))


def _age_seconds() -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    start = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]) / ticks
    return float(Path("/proc/uptime").read_text().split()[0]) - start


def machine_load(window_s: float = 0.2) -> LoadReading | None:
    """Read the load on this process's CPUs over ``window_s`` (Linux ``/proc``); None where it cannot be read."""
    meter = OtherWorkMeter()
    if not meter.start():
        return None
    time.sleep(window_s)
    busy = meter.read()
    try:
        load_avg = max(0.0, float(Path("/proc/loadavg").read_text().split()[0])
                       - own_load_share(sum(os.times()[:2]), _age_seconds()))
    except (OSError, ValueError, IndexError):
        load_avg = 0.0
    return None if busy is None else LoadReading(busy, load_avg, len(meter.cpus), os.cpu_count() or 1)


def oversubscribed(load: LoadReading | None, cores: int, threads: int, siblings: int = 0) -> str | None:
    """The warning when other work and this run's ``threads`` (all its local processes') need more than the
    usable cores, with half a core of slack for the reading's noise; None otherwise."""
    if load is None or threads <= load.free(cores, siblings) + 0.5:
        return None
    return (f"the machine is oversubscribed: {cores} usable core{'s' * (cores != 1)}, "
            f"{load.describe(siblings)}, and this run adds {threads} thread{'s' * (threads != 1)}; every step "
            "will be slower. Stop other jobs, or give each run its share with threads.runs (docs/INSTALL.md)")


@dataclass(frozen=True)
class ThreadPlan:
    """How many threads, and why (the log line). ``worker_threads``: the asynchronous rollout worker's
    share (``rollout.mode=async``; 0 when there is no worker). ``adaptive``: auto decided it on a CPU run of one
    process, so the count may follow the load while the run goes on (``callbacks/adaptive_threads.py``), up to
    ``cap`` (auto's share with no other work) within ``cores`` usable cores."""

    threads: int
    reason: str
    worker_threads: int = 0
    adaptive: bool = False
    cap: int = 0
    cores: int = 0


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
                               f"of {plan.threads}{share}", worker, plan.adaptive,
                      split_for_worker(plan.cap)[0] if plan.cap else 0, plan.cores)


def _siblings(local_processes: int, env: dict[str, str]) -> int:
    """This run's other local processes already running when the load is read: all of them under an external
    launcher (torchrun, SLURM: ``LOCAL_RANK`` is set in every rank), none when Lightning launches the ranks (the
    first process reads the load before it starts the others)."""
    return local_processes - 1 if env.get("LOCAL_RANK", "").strip() else 0


def auto_applies(setting: object, env: dict[str, str]) -> bool:
    """Whether ``auto`` computes the count here (so the load is worth reading): no explicit N, no user's
    ``OMP_NUM_THREADS``, and not a rank that inherited the count from the process that launched it."""
    if setting != "auto":
        return False
    omp = env.get("OMP_NUM_THREADS", "").strip()
    if not (omp.isdigit() and int(omp) > 0):
        return True
    return env.get(_MARK) == omp and env.get("LOCAL_RANK", "0").strip() in ("", "0")


def plan_threads(setting: object, runs: int, local_processes: int, cores: int, env: dict[str, str],
                 load: LoadReading | None = None) -> ThreadPlan:
    """Pure: the thread count for ``threads.num`` = ``setting`` ("auto" or N).

    Precedence: an explicit ``threads.num=N``; then ``OMP_NUM_THREADS`` from the environment (the
    user's own, not one this module set for a parent process); then auto = the idle cores / (local
    processes x runs), at least 1, where the idle cores are the usable ones that ``load`` finds free of other
    work on this process's CPUs (rounded to the nearest core; ``load=None``: all of them). A DDP rank that inherited
    this module's choice from the process that launched it keeps it (that process read the load before its
    siblings started).
    """
    split = max(1, local_processes * runs)
    auto = max(1, cores // split)
    why_auto = (f"{cores} usable core{'s' * (cores != 1)} / {local_processes} local "
                f"process{'es' * (local_processes != 1)} / threads.runs={runs}")
    if setting != "auto":
        return ThreadPlan(int(setting), f"threads.num={setting} (auto would give {auto}: {why_auto})")
    omp = env.get("OMP_NUM_THREADS", "").strip()
    if not auto_applies(setting, env):
        if env.get(_MARK) == omp:
            return ThreadPlan(int(omp), f"threads.num=auto: {omp}, as the process that launched this rank chose it")
        return ThreadPlan(int(omp), f"OMP_NUM_THREADS={omp} from the environment wins over threads.num=auto "
                                    f"(auto would give {auto}: {why_auto})")
    if load is None:
        return ThreadPlan(auto, f"threads.num=auto: {why_auto}")
    siblings = _siblings(local_processes, env)
    idle = math.floor(load.free(cores, siblings) + 0.5)
    threads = max(1, min(auto, idle // split))
    verdict = "" if threads == auto else (f": {idle} idle core{'s' * (idle != 1)} for {split} "
                                          f"process{'es' * (split != 1)} of this run, so {threads} instead of {auto}")
    return ThreadPlan(threads, f"threads.num=auto: {why_auto}; {load.describe(siblings)}{verdict}")


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
    from omegaconf import ListConfig

    t, accelerator = cfg.threads, str(cfg.trainer.accelerator)
    devices = cfg.trainer.devices
    devices = list(devices) if isinstance(devices, ListConfig) else devices
    procs = local_processes(devices, str(cfg.strategy.name), accelerator)
    setting, runs, cores, env = t.num, int(t.runs), usable_cores(), dict(os.environ)
    load = machine_load() if auto_applies(setting, env) else None  # about 0.2 s, only where auto decides
    plan = plan_threads(setting, runs, procs, cores, env, load)
    adaptive = auto_applies(setting, env) and procs == 1 and accelerator == "cpu"
    plan = replace(plan, adaptive=adaptive, cap=max(1, cores // max(1, procs * runs)), cores=cores)
    if str(cfg.rollout.mode) == "async":
        plan = with_worker(plan)
    torch.set_num_threads(plan.threads)
    ours = os.environ.get(_MARK)
    if os.environ.get("RAYON_NUM_THREADS") in (None, ours):
        os.environ["RAYON_NUM_THREADS"] = str(plan.threads)
    if os.environ.get("OMP_NUM_THREADS") in (None, ours):  # never overwrite the user's own
        os.environ["OMP_NUM_THREADS"] = os.environ[_MARK] = str(plan.threads)
    if os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("RANK", "0") == "0":
        log.info("CPU threads per process: %d (%s)", plan.threads, plan.reason)
        warning = oversubscribed(load, cores, (plan.threads + plan.worker_threads) * procs, _siblings(procs, env))
        if warning is not None:
            log.warning(warning)
    return plan


def export_wait_policy(cfg, env: MutableMapping[str, str] | None = None) -> str | None:
    """Export ``OMP_WAIT_POLICY`` = ``threads.wait_policy`` where auto decides the count and the variable is unset;
    returns what was set. Call it before torch loads: OpenMP reads it once, when its library loads (child
    processes, which inherit it, read it at their own start). Why passive: an OpenMP thread that waits for work
    otherwise spins on a core for a while, and beside busy processes those spins are the cores they need."""
    env = os.environ if env is None else env
    policy = cfg.threads.wait_policy
    if policy not in ("passive", "active") or "OMP_WAIT_POLICY" in env:  # a bad value is refused by the config checks
        return None
    if not auto_applies(cfg.threads.num, dict(env)):
        return None
    env["OMP_WAIT_POLICY"] = str(policy).upper()
    return env["OMP_WAIT_POLICY"]
