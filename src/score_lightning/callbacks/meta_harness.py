"""Refresh the meta-harness every M SCORE steps.

Why ``pl_module.score_step`` and not ``trainer.global_step``: under manual optimisation Lightning's
``global_step`` counts ``optimizer.step()`` calls, and one SCORE step calls it at least twice
(solver, then evaluator; more with PPO mini-batches). Counting with ``global_step`` would refresh
every M/2 SCORE steps or drift. The module increments ``score_step`` at the end of each
``training_step``, so here, in ``on_train_batch_end``, it already counts the step just finished.

The module must provide ``score_step: int``, ``harness_state: HarnessState`` and
``harness_stats() -> dict[str, float]``. The harness state itself is checkpointed by the module;
this callback checkpoints only its own bookkeeping (fires, failures).

Under multi-process training only rank 0 asks the harness (an LLM backend would otherwise be
called once per rank and could answer differently); the new state is broadcast so every rank
builds the same evaluator prompt. ``harness_stats()`` runs on every rank in case it reduces.
"""

from __future__ import annotations

from typing import Any

import lightning as L

from score_lightning.harness.base import MetaHarness
from score_lightning.harness.state import HarnessState
from score_lightning.telemetry.loggers import log_texts

_REQUIRED = ("score_step", "harness_state", "harness_stats")


class MetaHarnessCallback(L.Callback):
    """Calls ``harness.update`` when the completed SCORE step count is a multiple of ``every_n_steps``."""

    def __init__(self, harness: MetaHarness, every_n_steps: int = 5, enabled: bool = True, log_text: bool = True):
        if not isinstance(every_n_steps, int) or isinstance(every_n_steps, bool) or every_n_steps < 1:
            raise ValueError(f"harness.every_n_steps={every_n_steps!r}: must be an integer >= 1")
        self.harness = harness
        self.every_n_steps = every_n_steps
        self.enabled = enabled
        self.log_text = log_text
        self.fires = 0
        self.last_fired_step = 0  # guards against firing twice if score_step did not advance

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        missing = [name for name in _REQUIRED if not hasattr(pl_module, name)]
        if missing:
            raise AttributeError(f"MetaHarnessCallback needs the module to define {missing}")
        # the statistics window is this callback's period M, even when only the callback's value is overridden
        set_window = getattr(pl_module, "set_harness_window", None)
        if callable(set_window):
            set_window(self.every_n_steps)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The constraints in force from the first step (or from the resumed step), for the record.
        self._add_text(trainer, pl_module.harness_state, int(pl_module.score_step))

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = int(pl_module.score_step)
        if not self.enabled or step <= 0 or step % self.every_n_steps or step == self.last_fired_step:
            return
        stats = dict(pl_module.harness_stats())
        if trainer.is_global_zero:
            new = self.harness.update(pl_module.harness_state, stats)
            result = (new, self.harness.failures, self.harness.last_error)
        else:
            result = None
        new, failures, last_error = trainer.strategy.broadcast(result, src=0)
        self._sync_failures(failures, last_error)
        pl_module.harness_state = new
        self.fires += 1
        self.last_fired_step = step
        pl_module.log("harness/version", float(new.version), on_step=True, on_epoch=False)
        pl_module.log("harness/failures", float(failures), on_step=True, on_epoch=False)
        self._add_text(trainer, new, step)

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        return {
            "fires": self.fires,
            "last_fired_step": self.last_fired_step,
            "failures": int(getattr(self.harness, "failures", 0)),
            "last_error": str(getattr(self.harness, "last_error", "")),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.fires = int(state_dict.get("fires", 0))
        self.last_fired_step = int(state_dict.get("last_fired_step", 0))
        self._sync_failures(int(state_dict.get("failures", 0)), str(state_dict.get("last_error", "")))

    # ------------------------------------------------------------------ helpers
    def _sync_failures(self, failures: int, last_error: str) -> None:
        try:
            self.harness.failures = failures
            self.harness.last_error = last_error
        except AttributeError:  # a harness with read-only counters: nothing to restore
            pass

    def _add_text(self, trainer: L.Trainer, state: HarnessState, step: int) -> None:
        if not self.log_text or not trainer.is_global_zero:
            return
        # Indent by four spaces: TensorBoard renders text as markdown, this keeps the JSON verbatim.
        text = "\n".join("    " + line for line in state.to_json(include_pool=False).splitlines())
        log_texts(trainer.loggers, {"harness/state": text}, step, getattr(trainer, "default_root_dir", None))
