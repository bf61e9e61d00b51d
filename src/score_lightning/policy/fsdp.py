"""FSDP2 (``fully_shard``) for the policy, the evaluator and the frozen reference, plus gathering.

Applied from ``ScoreModule.configure_model`` under Lightning's ``ModelParallelStrategy``: each
decoder layer (the classes named by the model's own ``_no_split_modules``, not a hard-coded Qwen
class) is sharded, then the root. Gathering a full copy is collective: every rank must call it.
A LoRA policy shards like any model (FSDP2 keeps its frozen base weights in the same units, without
gradients); its KL reference is a view of the sharded policy and is not sharded again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import torch
from torch import nn

if TYPE_CHECKING:
    from score_lightning.config.schema import FSDPStrategyConfig


def decoder_layer_classes(model: nn.Module) -> set[str]:
    names = set(getattr(model, "_no_split_modules", None) or [])
    if not names:
        raise ValueError(f"{type(model).__name__} does not declare _no_split_modules; cannot pick FSDP units")
    return names


def shard_models(module, scfg: "FSDPStrategyConfig") -> None:
    """Shard the module's policy, evaluator and reference under ``strategy=fsdp`` (``scfg``: the ``strategy`` node)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mesh = module.device_mesh["data_parallel"]
    if scfg.mixed_precision in ("bf16", "bfloat16"):
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    elif scfg.mixed_precision in (None, "null", "none"):
        mp = MixedPrecisionPolicy()
    else:
        raise ValueError(f"strategy.mixed_precision={scfg.mixed_precision!r}: allowed null or 'bf16'")
    offload = CPUOffloadPolicy() if scfg.cpu_offload else OffloadPolicy()
    kwargs = dict(mesh=mesh, mp_policy=mp, offload_policy=offload, reshard_after_forward=bool(scfg.reshard_after_forward))
    for model, trainable in ((module.policy, True), (module.evaluator_policy, True), (module.ref, False)):
        if model is None or not any(True for _ in model.parameters()):
            continue  # a LoRA policy's reference is a view of the (already sharded) policy: nothing to shard
        layers = decoder_layer_classes(model)
        if trainable and scfg.activation_checkpointing:
            _apply_activation_checkpointing(model, layers)
        for sub in list(model.modules()):
            if type(sub).__name__ in layers:
                fully_shard(sub, **kwargs)
        fully_shard(model, **kwargs)


def _apply_activation_checkpointing(model: nn.Module, layers: set[str]) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper,
    )
    import functools

    apply_activation_checkpointing(
        model,
        checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
        check_fn=lambda m: type(m).__name__ in layers,
    )


def is_sharded(model: nn.Module) -> bool:
    return any(hasattr(p, "full_tensor") for p in model.parameters())


def iter_full_params(model: nn.Module, to_cpu: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (hf_name, full tensor) one parameter at a time: never the whole model gathered at once.

    Collective for sharded models: every rank must consume the iterator.
    """
    for name, p in model.state_dict().items():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        t = t.detach()
        yield hf_name(name), (t.cpu() if to_cpu else t)


def hf_name(name: str) -> str:
    """A parameter or module name without the prefix activation-checkpoint wrappers insert."""
    return name.replace("_checkpoint_wrapped_module.", "")


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """A full CPU state dict (collective when sharded), with HF parameter names."""
    return dict(iter_full_params(model, to_cpu=True))
