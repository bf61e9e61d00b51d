"""How many processes split the global batch: read from the config alone, before any process starts."""

from __future__ import annotations

from omegaconf import DictConfig, ListConfig


def data_parallel_size(cfg: DictConfig) -> int:
    """Processes that split the global batch: devices x nodes for ddp/fsdp, else 1."""
    name = cfg.strategy.name
    if name not in ("ddp", "fsdp"):
        return 1
    devices = cfg.trainer.devices
    devices = list(devices) if isinstance(devices, ListConfig) else devices
    tensor_parallel = cfg.strategy.tensor_parallel_size if name == "fsdp" else 1  # strategy=fsdp's key
    return data_parallel_processes(devices, cfg.trainer.num_nodes, tensor_parallel)


def data_parallel_processes(devices: int | str | list, num_nodes: int, tensor_parallel_size: int = 1) -> int:
    """devices x nodes / tensor-parallel size (Lightning's own "auto" data-parallel size would mean num_nodes)."""
    if isinstance(devices, str):
        devices = int(devices) if devices.isdigit() else 1
    per_node = devices if isinstance(devices, int) else len(devices)
    return max(1, int(per_node) * int(num_nodes) // int(tensor_parallel_size))

