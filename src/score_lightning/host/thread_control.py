"""Pure: the thread count a running process moves to after a reading of the cores other work leaves it.

Why it moves: a count chosen once at launch cannot follow work that starts later. ``tiny_score`` launched on 2
quiet cores kept 2 threads and took 3.6x its idle step beside one busy single-threaded process (7.9x beside
two), where 1 thread beside one took 1.25x (issue 69). Why asymmetric: a thread too many beside busy work costs
far more than a thread too few on a free core, so the count drops as soon as the free cores round below it and
rises only when every one of the last readings leaves the larger count ``margin`` cores more than rounding needs.
That band, and the run of readings a rise waits for, keep it from flapping.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def free_cores(usable: int, cpus: int, other: float, reserved: int = 0) -> float:
    """Cores this process may use that nothing else needs: its usable cores (affinity, cgroup quota) or its
    allowed CPUs less the cores other work kept busy on them, whichever is fewer, less ``reserved`` (the share a
    rollout worker holds)."""
    return min(float(usable), cpus - other) - reserved


def next_threads(current: int, cap: int, free: Sequence[float], margin: float, rise_after: int) -> int:
    """The count after the readings ``free`` (free cores since the last change, oldest first), within [1, cap].

    Down to the newest reading rounded (``floor(f + 0.5)``) when that is below ``current``. Up, with at least
    ``rise_after`` readings, to ``floor(f + 0.5 - margin)`` for the smallest ``f`` of the last ``rise_after``,
    when that is above ``current``. Else unchanged; a ``current`` above ``cap`` comes down to it.
    """
    new = current
    if free and math.floor(free[-1] + 0.5) < current:
        new = math.floor(free[-1] + 0.5)
    elif len(free) >= max(1, rise_after):
        new = max(current, math.floor(min(free[-max(1, rise_after):]) + 0.5 - margin))
    return max(1, min(cap, new))
