"""``rollout.mode`` and ``rollout.max_staleness`` read from a config, for every module that depends on them.

``sync`` (the default): each SCORE step generates its own batch, then updates. ``async``: a worker process
generates step t+1's batch while the trainer updates on step t's (:mod:`score_lightning.step.prefetch`,
:mod:`score_lightning.rollout.async_worker`), at most ``max_staleness`` policy versions behind.
"""

from __future__ import annotations

MODES = ("sync", "async")


def rollout_mode(cfg) -> str:
    rollout = cfg.get("rollout") or {}
    return str(rollout.get("mode", "sync"))


def asynchronous(cfg) -> bool:
    return rollout_mode(cfg) == "async"


def max_staleness(cfg) -> int:
    return int((cfg.get("rollout") or {}).get("max_staleness", 1))


def stale_rollouts(cfg) -> bool:
    """True when trained batches may come from an older policy than the trainer's (``async`` with
    ``max_staleness >= 1``): the engine's log-probs are then those of that older policy."""
    return asynchronous(cfg) and max_staleness(cfg) >= 1
