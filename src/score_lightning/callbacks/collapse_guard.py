"""Early stopping for the two failure modes the SCORE paper reports: entropy collapse and a
rise-then-fall reward.

With K = 10 rollouts, or with more training data, the paper's solver suddenly loses entropy and
its reward climbs and then falls as it learns to exploit the evaluator's blind spots. None of the
peer trainers (verl, TRL, OpenRLHF) guards against this, so a run silently trains past its best
point. :class:`CollapseGuard` watches ``solver/entropy`` and ``solver/reward_mean``, keeps a
``best.ckpt`` at the best rolling reward, and stops the run once a collapse persists.

The detection rules live in :class:`CollapseDetector`, a plain-Python object with no Lightning
dependency, so they can be unit-tested on synthetic sequences and persisted in checkpoints.
"""

from __future__ import annotations

import logging
import math
import os
from collections import deque
from typing import Any

import lightning as L

log = logging.getLogger(__name__)

__all__ = ["CollapseDetector", "CollapseGuard"]


def _as_float(value: Any) -> float | None:
    """A metric value as a finite-or-not float; ``None`` when absent or not a scalar."""
    if value is None:
        return None
    try:
        if hasattr(value, "item"):
            value = value.detach().float().item() if hasattr(value, "detach") else value.item()
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        return None


def _mean(xs: Any) -> float:
    xs = list(xs)
    return math.fsum(xs) / len(xs)


class CollapseDetector:
    """Pure detection logic over a stream of ``(step, entropy, reward)`` observations.

    **Entropy collapse.** Once ``step >= min_steps`` and ``window`` entropy values exist, each
    valid entropy value is a *check*: it fails when the mean of the last ``window`` values is
    below ``entropy_drop_ratio`` times the mean of the first ``window`` values (a relative drop,
    since absolute entropy depends on the model and vocabulary), or below ``entropy_floor``.

    **Rise-then-fall reward.** The rolling mean of the last ``window`` rewards is tracked, and the
    best one seen so far (at any step). Once ``step >= min_steps`` each valid reward is a check
    that fails when the rolling mean is more than
    ``reward_drop * max(|best|, reward_abs_floor)`` below the best. The floor keeps a best near 0
    from turning noise into a "drop".

    A rule fires after ``patience`` consecutive failed checks of that rule; one passing check
    resets its count, so a single-step dip never stops a run. NaN / inf / missing values are
    ignored: not recorded, not a check, and they do not reset the counts (a NaN reward from a
    batch without valid reports says nothing about collapse).
    """

    def __init__(
        self,
        window: int = 5,
        entropy_drop_ratio: float = 0.5,
        entropy_floor: float = 0.05,
        reward_drop: float = 0.2,
        patience: int = 2,
        min_steps: int = 10,
        reward_abs_floor: float = 0.01,
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if patience < 1:
            raise ValueError(f"patience must be >= 1, got {patience}")
        if entropy_drop_ratio < 0 or reward_drop < 0 or reward_abs_floor < 0:
            raise ValueError("entropy_drop_ratio, reward_drop and reward_abs_floor must be >= 0")
        self.window = window
        self.entropy_drop_ratio = entropy_drop_ratio
        self.entropy_floor = entropy_floor
        self.reward_drop = reward_drop
        self.patience = patience
        self.min_steps = min_steps
        self.reward_abs_floor = reward_abs_floor
        self.reset()

    def reset(self) -> None:
        """Forget all history (a fresh run)."""
        self.entropy_first: list[float] = []  # the first `window` valid entropies (the baseline)
        self.entropy_recent: deque[float] = deque(maxlen=self.window)
        self.reward_recent: deque[float] = deque(maxlen=self.window)
        self.best_reward_mean: float | None = None
        self.best_step: int | None = None
        self.entropy_strikes = 0
        self.reward_strikes = 0
        self.improved = False  # True iff the last update set a new best rolling reward
        self.last_reason: str | None = None
        self.last_step: int | None = None

    # ------------------------------------------------------------------ rules
    def _check_entropy(self, step: int, value: float) -> str | None:
        if len(self.entropy_first) < self.window:
            self.entropy_first.append(value)
        self.entropy_recent.append(value)
        if step < self.min_steps or len(self.entropy_recent) < self.window:
            return None
        first, last = _mean(self.entropy_first), _mean(self.entropy_recent)
        dropped = last < self.entropy_drop_ratio * first
        floored = last < self.entropy_floor
        self.entropy_strikes = self.entropy_strikes + 1 if (dropped or floored) else 0
        if self.entropy_strikes < self.patience:
            return None
        why = (
            f"below {self.entropy_drop_ratio:g} x initial mean {first:.4g}"
            if dropped
            else f"below floor {self.entropy_floor:g}"
        )
        return (
            f"entropy collapse at step {step}: mean entropy of last {self.window} steps {last:.4g} "
            f"{why} for {self.entropy_strikes} consecutive checks"
        )

    def _check_reward(self, step: int, value: float) -> str | None:
        self.reward_recent.append(value)
        if len(self.reward_recent) < self.window:
            return None
        rolling = _mean(self.reward_recent)
        if self.best_reward_mean is None or rolling > self.best_reward_mean:
            self.best_reward_mean, self.best_step, self.improved = rolling, step, True
        if step < self.min_steps:
            return None
        best = self.best_reward_mean
        threshold = self.reward_drop * max(abs(best), self.reward_abs_floor)
        self.reward_strikes = self.reward_strikes + 1 if best - rolling > threshold else 0
        if self.reward_strikes < self.patience:
            return None
        return (
            f"reward rise-then-fall at step {step}: rolling mean {rolling:.4g} is {best - rolling:.4g} "
            f"below the best {best:.4g} (step {self.best_step}; allowed {threshold:.4g}) "
            f"for {self.reward_strikes} consecutive checks"
        )

    def update(self, step: int, entropy: float | None = None, reward: float | None = None) -> str | None:
        """Record one step's metrics; return a collapse reason, or ``None`` while healthy."""
        self.improved = False
        self.last_step = int(step)
        reasons = []
        for value, check in ((entropy, self._check_entropy), (reward, self._check_reward)):
            v = _as_float(value)
            if v is not None and math.isfinite(v):
                reason = check(int(step), v)
                if reason:
                    reasons.append(reason)
        self.last_reason = "; ".join(reasons) or None
        return self.last_reason

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        """History and counters as plain Python values (checkpoint-safe)."""
        return {
            "window": self.window,
            "entropy_first": list(self.entropy_first),
            "entropy_recent": list(self.entropy_recent),
            "reward_recent": list(self.reward_recent),
            "best_reward_mean": self.best_reward_mean,
            "best_step": self.best_step,
            "entropy_strikes": self.entropy_strikes,
            "reward_strikes": self.reward_strikes,
            "last_reason": self.last_reason,
            "last_step": self.last_step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`. A different ``window`` keeps the most recent values."""
        self.reset()
        self.entropy_first = list(state.get("entropy_first", []))[: self.window]
        self.entropy_recent.extend(state.get("entropy_recent", []))
        self.reward_recent.extend(state.get("reward_recent", []))
        self.best_reward_mean = state.get("best_reward_mean")
        self.best_step = state.get("best_step")
        self.entropy_strikes = int(state.get("entropy_strikes", 0))
        self.reward_strikes = int(state.get("reward_strikes", 0))
        self.last_reason = state.get("last_reason")
        self.last_step = state.get("last_step")


class CollapseGuard(L.Callback):
    """Stop training on entropy collapse or a rise-then-fall reward; keep the best checkpoint.

    After every training batch the guard reads ``monitor_entropy`` and ``monitor_reward`` from
    ``trainer.callback_metrics`` (logged by the module with ``self.log``; a missing key is skipped,
    and ``<key>_step`` is accepted for metrics logged with ``on_epoch=True`` too) and feeds them to
    a :class:`CollapseDetector`. The step is ``pl_module.score_step`` when the module has one
    (SCORE steps, which is what ``trainer.max_steps`` counts), otherwise the number of training
    batches seen (1 after the first).

    Whenever the rolling reward mean reaches a new best and ``save_best`` is set, it saves
    ``best_path`` (default ``<default_root_dir>/checkpoints/best.ckpt``), so the run's best model
    survives the fall. On collapse it warns (``logging`` and ``pl_module.print``), records
    :attr:`stopped_reason` and sets ``trainer.should_stop``. Decisions are taken on rank 0 and
    broadcast, so every rank saves and stops together (``save_checkpoint`` is collective under
    FSDP / DDP). The detector history is part of the checkpoint, so a resumed run continues the
    same windows and patience counts.
    """

    def __init__(
        self,
        monitor_entropy: str = "solver/entropy",
        monitor_reward: str = "solver/reward_mean",
        save_best: bool = True,
        best_path: str | None = None,
        enabled: bool = True,
        **detector: Any,
    ) -> None:
        """``detector`` holds the :class:`CollapseDetector` settings (window, thresholds, patience, ...)."""
        super().__init__()
        self.monitor_entropy = monitor_entropy
        self.monitor_reward = monitor_reward
        self.save_best = save_best
        self.best_path = best_path
        self.enabled = enabled
        self.detector = CollapseDetector(**detector)
        self.stopped_reason: str | None = None
        self.stopped_step: int | None = None
        self.best_model_path: str | None = None
        self._batches_seen = 0

    @property
    def state_key(self) -> str:
        return self._generate_state_key(monitor_entropy=self.monitor_entropy, monitor_reward=self.monitor_reward)

    @property
    def best_reward_mean(self) -> float | None:
        return self.detector.best_reward_mean

    @staticmethod
    def _metric(metrics: dict[str, Any], key: str) -> float | None:
        for k in (key, f"{key}_step"):
            if k in metrics:
                return _as_float(metrics[k])
        return None

    def _step(self, pl_module: L.LightningModule) -> int:
        step = getattr(pl_module, "score_step", None)
        return self._batches_seen if step is None else int(step)

    def _resolve_best_path(self, trainer: L.Trainer) -> str:
        return self.best_path or os.path.join(trainer.default_root_dir, "checkpoints", "best.ckpt")

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self.enabled:
            return
        self._batches_seen += 1
        step = self._step(pl_module)
        metrics = trainer.callback_metrics
        entropy = self._metric(metrics, self.monitor_entropy)
        reward = self._metric(metrics, self.monitor_reward)
        reason = self.detector.update(step, entropy=entropy, reward=reward)
        improved = self.detector.improved
        # rank 0 decides for everyone: per-rank metrics may differ, and a save or stop taken by
        # only some ranks would hang the collective checkpoint / the next all-reduce
        improved, reason = trainer.strategy.broadcast((improved, reason), src=0)

        if improved and self.save_best:
            path = self._resolve_best_path(trainer)
            trainer.save_checkpoint(path, weights_only=False)  # full state; unset, Lightning logs that it chose so
            self.best_model_path = path

        if reason:
            self.stopped_reason = reason
            self.stopped_step = step
            msg = f"CollapseGuard: stopping training. {reason}"
            if self.best_model_path:
                msg += f". Best checkpoint: {self.best_model_path}"
            log.warning(msg)
            pl_module.print(msg)
            trainer.should_stop = True

    def state_dict(self) -> dict[str, Any]:
        return {
            "detector": self.detector.state_dict(),
            "stopped_reason": self.stopped_reason,
            "stopped_step": self.stopped_step,
            "best_model_path": self.best_model_path,
            "batches_seen": self._batches_seen,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.detector.load_state_dict(state_dict.get("detector", {}))
        self.stopped_reason = state_dict.get("stopped_reason")
        self.stopped_step = state_dict.get("stopped_step")
        self.best_model_path = state_dict.get("best_model_path")
        self._batches_seen = int(state_dict.get("batches_seen", 0))
