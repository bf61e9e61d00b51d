"""How many of this process's CPUs other work keeps busy, measured on those CPUs only.

Why per CPU: a host-wide reading (the run queue, the load average) counts work on cores this process may not
use; scaled to a share of the host, it gave 1 thread on an idle 8-core cpuset of a 64-CPU host whose other
cores were busy (issue 69). Here the busy time of the allowed CPUs (``/proc/stat``, per-CPU lines) over an
interval, less the CPU time this process and its children used in it (``psutil``), is the other work, in
cores. It stays right while this process itself saturates the cores: its own threads are taken out, however
many of them run.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

#: /proc/stat columns after the name: user nice system idle iowait irq softirq steal (guest is inside user).
#: Idle and iowait are free time; steal is time the hypervisor gave to other guests: not this CPU's to use.
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)


def allowed_cpus() -> frozenset[int]:
    """The CPUs this process may run on (its affinity mask; every CPU where the platform has none)."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return frozenset(range(os.cpu_count() or 1))


def busy_ticks(stat_text: str, cpus: frozenset[int]) -> dict[int, int]:
    """Pure: busy clock ticks since boot of each CPU of ``cpus`` found in ``stat_text`` (``/proc/stat``)."""
    out = {}
    for line in stat_text.splitlines():
        name, _, rest = line.partition(" ")
        if not (name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus):
            continue
        values = [int(v) for v in rest.split()]
        out[int(name[3:])] = sum(values[i] for i in _BUSY_COLUMNS if i < len(values))
    return out


@dataclass(frozen=True)
class CpuSample:
    """One reading: when (monotonic seconds), each allowed CPU's busy ticks, and the CPU seconds this process and
    each of its children (by pid) had used."""

    t: float
    ticks: dict[int, int]
    own: dict[int, float]


def _tree_cpu_seconds() -> dict[int, float]:
    """CPU seconds (user + system, all threads) of this process and its descendants (the rollout worker)."""
    me = psutil.Process()
    out = {}
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            out[proc.pid] = times.user + times.system
        except psutil.Error:  # a child that ended between the listing and the read
            continue
    return out


def sample(cpus: frozenset[int], stat_path: Path = Path("/proc/stat")) -> CpuSample | None:
    """A reading now; None where ``/proc/stat`` cannot be read (not Linux)."""
    try:
        ticks = busy_ticks(stat_path.read_text(), cpus)
    except OSError:
        return None
    return CpuSample(time.monotonic(), ticks, _tree_cpu_seconds()) if ticks else None


def other_busy(before: CpuSample, after: CpuSample, hz: float) -> float:
    """Pure: cores of the CPUs read that other work kept busy between two samples: their busy seconds less this
    process tree's CPU seconds, over the wall time, within [0, the CPUs read]. A child that started in between
    counts all its time as ours; one that ended in between is lost (its last seconds count as other work)."""
    wall = after.t - before.t
    cpus = before.ticks.keys() & after.ticks.keys()
    if wall <= 0 or not cpus:
        return 0.0
    busy_s = sum(after.ticks[c] - before.ticks[c] for c in cpus) / hz
    own_s = sum(max(0.0, s - before.own.get(pid, 0.0)) for pid, s in after.own.items())
    return min(float(len(cpus)), max(0.0, (busy_s - own_s) / wall))


def clock_ticks_per_second() -> float:
    """``USER_HZ``, the unit of ``/proc/stat``."""
    return float(os.sysconf("SC_CLK_TCK"))


class OtherWorkMeter:
    """Other work on this process's CPUs between successive reads (the callback reads it once per step window)."""

    def __init__(self, cpus: frozenset[int] | None = None, stat_path: Path = Path("/proc/stat")) -> None:
        self.cpus = cpus if cpus is not None else allowed_cpus()
        self._stat_path, self._hz = stat_path, clock_ticks_per_second()
        self._last: CpuSample | None = None

    def start(self) -> bool:
        """Take the first sample; False where the CPUs cannot be read (then every read is None)."""
        self._last = sample(self.cpus, self._stat_path)
        return self._last is not None

    def read(self) -> float | None:
        """Cores other work kept busy since the previous read (or start); None where it cannot be read."""
        now = sample(self.cpus, self._stat_path)
        if now is None or self._last is None:
            return None
        other, self._last = other_busy(self._last, now, self._hz), now
        return other
