"""Preemption: on SIGTERM/SIGUSR1 finish the current SCORE step, save ``last.ckpt``, exit 75.

The signal handler only records the signal (nothing unsafe runs inside it). At the end of the
step every rank agrees on stopping (rank 0's flag is reduced across ranks), ``last.ckpt`` is
written atomically, and the run exits with :data:`EXIT_PREEMPTED`. If the step does not finish
within ``grace_s`` (a long rollout), a watchdog abandons it: the process exits with the same code
and the previous ``last.ckpt`` (complete, thanks to atomic writes) is what a resume uses.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

from lightning.pytorch import Callback

log = logging.getLogger(__name__)

#: EX_TEMPFAIL: "temporary failure, retry" — what a requeue script should look for
EXIT_PREEMPTED = 75


class Preempted(SystemExit):
    def __init__(self) -> None:
        super().__init__(EXIT_PREEMPTED)


class PreemptionCallback(Callback):
    def __init__(self, grace_s: float = 300.0, signals: tuple[str, ...] = ("SIGTERM", "SIGUSR1")):
        self.grace_s = float(grace_s)
        self.signal_names = signals
        self.received: str | None = None
        self.received_at: float | None = None
        self.preempted = False
        self._previous: dict[int, object] = {}
        self._watchdog: threading.Thread | None = None

    # -- handler: record only
    def _handle(self, signum, frame) -> None:
        if self.received is None:
            self.received, self.received_at = signal.Signals(signum).name, time.monotonic()
            log.warning("received %s: finishing the current SCORE step, then saving and exiting", self.received)
            if self.grace_s > 0:
                self._watchdog = threading.Thread(target=self._enforce_grace, daemon=True)
                self._watchdog.start()

    def _enforce_grace(self) -> None:
        time.sleep(self.grace_s)
        if not self.preempted:
            log.error("step did not finish within %.0f s of %s: abandoning it (last.ckpt is the previous step)",
                      self.grace_s, self.received)
            logging.shutdown()
            os._exit(EXIT_PREEMPTED)

    def on_train_start(self, trainer, pl_module) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for name in self.signal_names:
            sig = getattr(signal, name)
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._handle)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        stop = trainer.strategy.reduce_boolean_decision(self.received is not None, all=False)
        if not stop:
            return
        from score_lightning.callbacks.checkpoint import ScoreCheckpoint

        for cb in trainer.checkpoint_callbacks:
            if isinstance(cb, ScoreCheckpoint):
                cb.save_last_now(trainer)
        self.preempted = True
        trainer.should_stop = True
        log.warning("preempted at SCORE step %s: last.ckpt saved; exiting with %d",
                    getattr(pl_module, "score_step", "?"), EXIT_PREEMPTED)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
