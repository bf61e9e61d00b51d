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

import torch

from score_lightning.policy.lora import iter_merged_params

#: keys of configs/rollout/vllm.yaml passed to VLLMEngine (``seeded_requests`` and ``enable_prefix_caching``
#: are optional: engine defaults apply when absent)
ENGINE_KEYS = ("dtype", "gpu_memory_utilization", "tensor_parallel_size", "max_model_len", "enable_sleep_mode",
               "enforce_eager", "max_batch_size", "seeded_requests", "enable_prefix_caching")


def engine_kwargs(rollout_cfg: dict, run_seed: int = 0) -> dict:
    """:class:`VLLMEngine` keyword arguments from the ``rollout`` config (``rollout.seed``, else the run's seed)."""
    kw = {k: rollout_cfg[k] for k in ENGINE_KEYS if k in rollout_cfg and rollout_cfg[k] is not None}
    seed = rollout_cfg.get("seed")
    kw["seed"] = int((run_seed if seed is None else seed) or 0)
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
