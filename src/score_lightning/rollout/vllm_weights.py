"""A vLLM engine built from ``rollout=vllm``'s keys, and a policy's weights pushed into it.

One place for both, used wherever a vLLM engine samples for training: the colocated engine of
``rollout.mode=sync`` (:class:`~score_lightning.callbacks.vllm_rollout.VLLMRolloutCallback`) and the
asynchronous rollout worker's own engine (``rollout.mode=async``,
:mod:`score_lightning.generation.async_worker`). Both therefore start the same engine from the same config
and load weights the same way: every parameter of the policy as (HF name, full tensor), LoRA adapters
merged into their base weights, streamed into ``reload_weights`` (:meth:`VLLMEngine.sync_weights`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from score_lightning.policy.lora import iter_merged_params

if TYPE_CHECKING:
    from score_lightning.config.schema import VLLMRolloutConfig

#: keys of configs/rollout/vllm.yaml passed to VLLMEngine (its ``seeded_requests`` and ``enable_prefix_caching``
#: keep the engine's defaults: no config key sets them)
ENGINE_KEYS = ("dtype", "gpu_memory_utilization", "tensor_parallel_size", "max_model_len", "enable_sleep_mode",
               "enforce_eager", "max_batch_size")


def engine_kwargs(rollout: "VLLMRolloutConfig | Mapping[str, Any]", seed: int) -> dict:
    """:class:`VLLMEngine` keyword arguments from the ``rollout=vllm`` node (or its plain copy, as the rollout worker
    holds it), sampling under the run's ``seed``."""
    kw = {k: rollout[k] for k in ENGINE_KEYS}
    kw = {k: v for k, v in kw.items() if v is not None}  # a null key (max_model_len: null): the engine's default
    kw["seed"] = int(seed)
    return kw


def push_policy_weights(engine, policy) -> float:
    """Stream ``policy``'s weights into ``engine`` (``None``: only take part in the gathers); the seconds taken.

    ``iter_merged_params`` yields one parameter at a time (``full_tensor()`` is collective under FSDP2, so a
    rank without an engine must still consume it); a LoRA policy's adapters are merged under the base's
    names, as vLLM has no adapter here. GPU engines take the tensors where the trainer holds them.
    """
    t0 = time.perf_counter()
    params = iter_merged_params(policy, to_cpu=not torch.cuda.is_available())
    if engine is not None:
        engine.sync_weights(params)
    else:
        for _ in params:
            pass
    return time.perf_counter() - t0
