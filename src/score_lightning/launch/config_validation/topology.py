"""How many processes split the global batch: read from the config alone, before any process starts."""

from __future__ import annotations

from omegaconf import DictConfig, ListConfig, OmegaConf


def data_parallel_size(cfg: DictConfig) -> int:
    """Processes that split the global batch: devices x nodes for ddp/fsdp, else 1."""
    if OmegaConf.select(cfg, "strategy.name") not in ("ddp", "fsdp"):
        return 1
    devices = OmegaConf.select(cfg, "trainer.devices")
    devices = list(devices) if isinstance(devices, ListConfig) else devices
    return data_parallel_processes(devices, OmegaConf.select(cfg, "trainer.num_nodes") or 1,
                                   OmegaConf.select(cfg, "strategy.tensor_parallel_size") or 1)


def data_parallel_processes(devices: int | str | list, num_nodes: int, tensor_parallel_size: int = 1) -> int:
    """devices x nodes / tensor-parallel size (Lightning's own "auto" data-parallel size would mean num_nodes)."""
    if isinstance(devices, str):
        devices = int(devices) if devices.isdigit() else 1
    per_node = devices if isinstance(devices, int) else len(devices)
    return max(1, int(per_node) * int(num_nodes) // int(tensor_parallel_size))

