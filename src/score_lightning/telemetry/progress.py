"""SCORE-step progress with an ETA, on a terminal and in a log file alike.

Lightning's default bar counts batches of an epoch (and shows "Epoch 0/-2" for a step-bounded run).
A SCORE run is a number of SCORE steps, so this bar counts those, starts at the resumed step, and
shows the reward. Without a terminal (a batch job's log file) it writes one line every
``log_every_s`` seconds instead, so a log shows progress and an ETA too. Step numbers are the
TensorBoard x-axis (0-based).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from lightning.pytorch.callbacks.progress.progress_bar import ProgressBar

log = logging.getLogger(__name__)


def _fmt(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _total(trainer) -> int:
    """SCORE steps (``max_steps``), or the optimiser steps of a bounded run such as the cold start."""
    return int(trainer.max_steps) if trainer.max_steps and trainer.max_steps > 0 else int(trainer.estimated_stepping_batches)


class ScoreProgress(ProgressBar):
    """A progress bar over ``trainer.max_steps`` SCORE steps; log lines instead when not on a TTY."""

    def __init__(self, log_every_s: float = 30.0, tty: bool | None = None, desc: str = "SCORE steps") -> None:
        super().__init__()
        self.desc = desc
        self.log_every_s = float(log_every_s)
        self.tty = sys.stderr.isatty() if tty is None else tty
        self._enabled = True
        self._bar = None
        self._t0 = self._last_log = 0.0
        self._start_step = 0

    # ProgressBar interface
    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def on_train_start(self, trainer, pl_module) -> None:
        self._t0 = self._last_log = time.perf_counter()
        self._start_step = int(getattr(pl_module, "score_step", trainer.global_step))
        if self._enabled and self.tty and trainer.is_global_zero:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=_total(trainer), initial=self._start_step, desc=self.desc, unit="step",
                             dynamic_ncols=True, file=sys.stderr)

    def on_train_batch_end(self, trainer, pl_module, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not self._enabled or not trainer.is_global_zero:
            return
        done = int(getattr(pl_module, "score_step", trainer.global_step))
        total = _total(trainer)
        metrics = trainer.callback_metrics
        reward = float(metrics["solver/reward_mean"]) if "solver/reward_mean" in metrics else float("nan")
        if self._bar is not None:
            self._bar.update(done - self._bar.n)
            self._bar.set_postfix(reward=f"{reward:.3f}", refresh=False)
            return
        now = time.perf_counter()
        if now - self._last_log < self.log_every_s and done < total:
            return
        self._last_log = now
        rate = (now - self._t0) / max(done - self._start_step, 1)
        shown = f" reward={reward:.3f}" if reward == reward else ""
        log.info("%s: %d/%d (%.0f%%)%s elapsed %s ETA %s", self.desc, done, total, 100.0 * done / max(total, 1),
                 shown, _fmt(now - self._t0), _fmt(rate * (total - done)))

    def on_train_end(self, trainer, pl_module) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
