"""The torch thread count of a CPU run follows the cores other work keeps busy, re-read between SCORE steps.

Why: ``threads.num=auto`` decides at launch (``launch/threads.py``), and work that starts later went unseen:
``tiny_score`` launched on 2 quiet cores kept 2 threads and took 3.6x its idle step beside one busy
single-threaded process, 7.9x beside two (issue 69). Every ``every_n_steps`` SCORE steps this callback reads the
other work on the process's own CPUs over those steps (``host/cpu_load.py``), moves the count with hysteresis
(``host/thread_control.py``) through ``torch.set_num_threads``, and logs each change once with its reason. It acts
only where the launch plan says auto decided on a CPU run of one process (``ThreadPlan.adaptive``): a fixed
``threads.num``, a user's ``OMP_NUM_THREADS`` and multi-process runs keep their count.
"""

from __future__ import annotations

import logging
from typing import Any

from lightning.pytorch import Callback

from score_lightning.host.cpu_load import OtherWorkMeter
from score_lightning.host.thread_control import free_cores, next_threads

log = logging.getLogger(__name__)


class AdaptiveThreads(Callback):
    """Between SCORE steps: read the other work on this process's CPUs, change the thread count when it moved.

    ``meter``: where the readings come from (an :class:`OtherWorkMeter` on the allowed CPUs unless given; tests
    give one that replays a load)."""

    def __init__(self, every_n_steps: int, margin: float, rise_after: int, meter: Any = None) -> None:
        self.every_n_steps, self.margin, self.rise_after = int(every_n_steps), float(margin), int(rise_after)
        self.meter = meter
        self.active = False
        self.current = 0
        self.changes: list[tuple[int, int, str]] = []  # (old, new, reason): what the log said
        self._plan: Any = None
        self._steps = 0
        self._started = False
        self._free: list[float] = []

    def on_train_start(self, trainer, pl_module) -> None:
        import torch

        self._plan = getattr(pl_module, "thread_plan", None)
        self.active = self.every_n_steps > 0 and bool(getattr(self._plan, "adaptive", False))
        if not self.active:
            return
        self.meter = self.meter if self.meter is not None else OtherWorkMeter()
        self.active = bool(self.meter.start())  # no /proc/stat (not Linux): the launch count stays
        self.current, self._steps, self._started, self._free = torch.get_num_threads(), 0, False, []

    def on_train_batch_start(self, trainer, pl_module, batch: Any, batch_idx: int) -> None:
        if not self.active:
            return
        if not self._started:  # the first step of this fit: nothing measured yet
            self._started = True
            return
        self._steps += 1
        if self._steps < self.every_n_steps:
            return
        other, steps = self.meter.read(), self._steps
        self._steps = 0
        if other is None:
            return
        self._decide(other, steps)

    def _decide(self, other: float, steps: int) -> None:
        import torch

        plan, cpus = self._plan, len(self.meter.cpus)
        free = free_cores(plan.cores, cpus, other, plan.worker_threads)
        self._free = (self._free + [free])[-max(1, self.rise_after):]
        new = next_threads(self.current, plan.cap, self._free, self.margin, self.rise_after)
        if new == self.current:
            return
        span = "SCORE step" if steps == 1 else f"{steps} SCORE steps"
        why = (f"other work kept {other:.1f} of the {cpus} allowed CPU{'s' * (cpus != 1)} busy over the last {span}: "
               f"{free:.1f} free core{'s' * (round(free, 1) != 1)}")
        if new > self.current and self.rise_after > 1:
            why += f", at least {min(self._free):.1f} in each of the last {len(self._free)} readings"
        if plan.worker_threads:
            why += f" beside the rollout worker's {plan.worker_threads}"
        torch.set_num_threads(new)
        log.info("CPU threads: %d -> %d (%s)", self.current, new, why)
        self.changes.append((self.current, new, why))
        self.current, self._free = new, []
