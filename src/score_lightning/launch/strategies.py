"""Lightning strategies built from ``configs/strategy/*.yaml`` with ``hydra.utils.instantiate``.

Each config names one of these factories as its ``_target_``: they turn the project's flat, stable
config keys (``strategy.activation_checkpointing``, ``strategy.cpu_offload``, ...) into a Lightning
strategy. The FSDP2 sharding options themselves are applied by ``ScoreModule.configure_model``
(``fully_shard`` per decoder layer); the factory validates them so a typo fails before any model
loads. ``name`` is the strategy's short name the module branches on (``single``, ``ddp``, ``fsdp``).
"""

from __future__ import annotations

from collections.abc import Sequence

from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy, SingleDeviceStrategy

from score_lightning.launch.config_validation import data_parallel_processes


def single(accelerator: str = "cpu", name: str = "single") -> SingleDeviceStrategy:
    """One process on one device (``cuda:0`` for ``trainer.accelerator=gpu``)."""
    return SingleDeviceStrategy(device="cpu" if accelerator == "cpu" else "cuda:0")


def ddp(shared_actor: bool = True, process_group_backend: str | None = None, name: str = "ddp") -> DDPStrategy:
    """DistributedDataParallel; gloo on CPU and nccl on CUDA when ``process_group_backend`` is null.

    A separate evaluator model (``actor.shared=false``) is unused in the solver's backward, so DDP
    must then look for unused parameters; a shared actor uses every parameter and skips that cost.
    """
    return DDPStrategy(process_group_backend=process_group_backend, find_unused_parameters=not shared_actor)


def fsdp2(
    devices: int | str | Sequence[int] = 1,
    num_nodes: int = 1,
    data_parallel_size: int | str | None = "auto",
    tensor_parallel_size: int = 1,
    save_distributed_checkpoint: bool = True,
    mixed_precision: str | None = None,
    cpu_offload: bool = False,
    reshard_after_forward: bool = True,
    activation_checkpointing: bool = False,
    name: str = "fsdp",
) -> ModelParallelStrategy:
    """FSDP2 (``fully_shard``) through Lightning's ``ModelParallelStrategy`` (works on CPU with gloo)."""
    if mixed_precision not in (None, "null", "none", "bf16", "bfloat16"):
        raise ValueError(f"strategy.mixed_precision={mixed_precision!r}: allowed null or 'bf16'")
    dp = data_parallel_size
    if dp in (None, "auto"):
        dp = data_parallel_processes(devices, num_nodes, tensor_parallel_size)
    return ModelParallelStrategy(data_parallel_size=int(dp), tensor_parallel_size=int(tensor_parallel_size),
                                 save_distributed_checkpoint=bool(save_distributed_checkpoint))
