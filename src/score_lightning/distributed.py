"""Small collectives over the default process group, safe to call in a single process.

Every helper is a no-op (or the identity) when ``torch.distributed`` is not initialised, so the
step stages run unchanged in one process, under DDP and under FSDP2. Each one is collective when
several processes run: every rank must call it, in the same order.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


def world_size() -> int:
    """Number of data-parallel processes (1 without ``torch.distributed``)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _device() -> torch.device:
    """Where collective tensors must live: the current GPU under NCCL, else the CPU (gloo)."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def global_sum(value: float) -> float:
    """Sum of ``value`` over ranks (float64, so token counts stay exact)."""
    if world_size() == 1:
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64, device=_device())
    dist.all_reduce(t)
    return float(t.item())


def pooled_mean(total: float, count: int, empty: float = 0.0) -> float:
    """``total / count`` with both summed over ranks (``empty`` when no rank counted any): the whole batch's value,
    not rank 0's share. Collective: every rank calls it, in the same order."""
    total, count = global_sum(total), global_sum(count)
    return total / count if count > 0 else empty


def global_max(value: float) -> float:
    """Maximum of ``value`` over ranks."""
    if world_size() == 1:
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64, device=_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def broadcast_object(obj: T, src: int = 0) -> T:
    """Rank ``src``'s object on every rank (pickled; for small objects such as a rubric)."""
    if world_size() == 1:
        return obj
    box = [obj if rank() == src else None]
    dist.broadcast_object_list(box, src=src)
    return box[0]  # type: ignore[return-value]


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's object, in rank order."""
    if world_size() == 1:
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out
