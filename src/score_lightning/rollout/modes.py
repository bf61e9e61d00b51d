"""``rollout.mode``, ``rollout.max_staleness`` and the evaluator's engine read from a config, for every module that
depends on them (the trainer, the rollout worker, config validation and the budget check).

``sync`` (the default): each SCORE step generates its own batch, then updates. ``async``: a worker process
generates step t+1's batch while the trainer updates on step t's (:mod:`score_lightning.generation.prefetch`,
:mod:`score_lightning.generation.async_worker`), at most ``max_staleness`` policy versions behind.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

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


def evaluator_on_vllm(cfg: DictConfig) -> bool:
    """The evaluator role (rubrics, scoring) generates on the vLLM engine: ``rollout=vllm``, a shared actor, and
    ``rollout.evaluator_engine=vllm`` (its default); otherwise it runs on HF generate() over its own module."""
    return (OmegaConf.select(cfg, "rollout.engine") == "vllm" and OmegaConf.select(cfg, "actor.shared") is not False
            and OmegaConf.select(cfg, "rollout.evaluator_engine", default="vllm") == "vllm")
