"""Checkpoints that are either whole or absent: atomic writes, and validation before a resume.

A preempted or crashed save must never leave a half-written ``last.ckpt`` that a later resume
trusts. Writes go to a temporary file in the same directory, are fsynced and then renamed over
the target (``os.replace`` is atomic on POSIX). A resume validates the checkpoint *before* any
model is loaded and refuses a truncated or foreign file with a message that says what to do.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

REQUIRED_KEYS = ("state_dict", "optimizer_states", "loops", "score")
META_KEYS = ("loops", "score")  # a sharded (FSDP) checkpoint keeps these in meta.pt


class CheckpointError(RuntimeError):
    """A checkpoint is corrupt, partial or not ours; nothing was loaded."""


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        atomic_torch_save(checkpoint, Path(path))


def atomic_torch_save(obj: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(obj, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def validate_checkpoint(path: str | os.PathLike, check_state: Callable[[Path, Any], None] | None = None) -> int | None:
    """Raise :class:`CheckpointError` unless ``path`` is a complete score-lightning checkpoint; return the SCORE step
    it holds (Lightning's ``global_step``, which counts SCORE steps here), or None when it stores none.

    ``check_state(path, state)`` sees the run state it stores (``ckpt["score"]``): the layers above (the
    asynchronous batch in flight, say) check their own part there, before any model loads."""
    p = Path(path)
    advice = "delete it and resume from an earlier checkpoint (checkpoints/step-*.ckpt) or start fresh"
    if not p.exists():
        raise CheckpointError(f"ckpt_path={p}: no such checkpoint")
    if p.is_dir():  # FSDP sharded checkpoint: meta.pt + one .distcp per rank + .metadata
        meta, needed = p / "meta.pt", META_KEYS
        if not (p / ".metadata").exists() or not list(p.glob("*.distcp")):
            raise CheckpointError(f"ckpt_path={p}: sharded checkpoint is missing .metadata or its shards; {advice}")
    else:
        meta, needed = p, REQUIRED_KEYS
    try:
        data = torch.load(meta, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated zip, wrong format, foreign pickle...
        raise CheckpointError(f"ckpt_path={p}: corrupt or partial checkpoint ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:200]}); {advice}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"ckpt_path={p}: not a Lightning checkpoint; {advice}")
    missing = [k for k in needed if k not in data]
    if missing:
        raise CheckpointError(f"ckpt_path={p}: not a complete score-lightning checkpoint (missing {missing}); {advice}")
    if check_state is not None:
        check_state(p, data["score"])
    step = data.get("global_step")
    return int(step) if isinstance(step, int) else None
