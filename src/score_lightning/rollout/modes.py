"""``rollout.mode``, ``rollout.max_staleness`` and the evaluator's engine, read from the ``rollout`` node (and the
``actor`` node) for every module that depends on them (the trainer, the rollout worker, config validation and the
budget check).

``sync``: each SCORE step generates its own batch, then updates. ``async``: a worker process generates step t+1's
batch while the trainer updates on step t's (:mod:`score_lightning.generation.prefetch`,
:mod:`score_lightning.generation.async_worker`), at most ``max_staleness`` policy versions behind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from score_lightning.config.schema import ActorConfig, RolloutConfig, VLLMRolloutConfig

MODES = ("sync", "async")


def asynchronous(rollout: "RolloutConfig") -> bool:
    return str(rollout.mode) == "async"


def max_staleness(rollout: "RolloutConfig") -> int:
    return int(rollout.max_staleness)


def stale_rollouts(rollout: "RolloutConfig") -> bool:
    """True when trained batches may come from an older policy than the trainer's (``async`` with
    ``max_staleness >= 1``): the engine's log-probs are then those of that older policy."""
    return asynchronous(rollout) and max_staleness(rollout) >= 1


def evaluator_on_vllm(rollout: "RolloutConfig | VLLMRolloutConfig", actor: "ActorConfig") -> bool:
    """The evaluator role (rubrics, scoring) generates on the vLLM engine: ``rollout=vllm``, a shared actor, and
    ``rollout.evaluator_engine=vllm`` (its default); otherwise it runs on HF generate() over its own module.
    ``rollout.evaluator_engine`` is read under ``rollout=vllm`` only: the other options have no such key."""
    return str(rollout.engine) == "vllm" and actor.shared is not False and str(rollout.evaluator_engine) == "vllm"
