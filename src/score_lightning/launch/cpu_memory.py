"""Keep a CPU process's resident memory near what its tensors hold (``trainer.malloc_mmap_threshold_mb``).

Why: torch's CPU tensors come from glibc ``malloc``. glibc serves a request below its mmap threshold
from the heap, and that threshold rises by itself (up to 32 MB) each time a large block is freed, so
after a few steps every activation, KV block and logits chunk of a real model lives on the heap. Freed
heap memory in the middle of the heap is never returned to the system. Measured on SmolLM2-135M (one
forward and backward with LoRA and gradient checkpointing, 4 rows x 700 tokens): the tensors alive at
the peak hold ~0.2 GB beside the 0.54 GB of weights, yet RSS reached 4.1 GB; with the threshold fixed
at 4 MB it reached 1.8 GB, for ~20% more time (a fresh block is zero-filled by the kernel). A fixed
threshold also stops the automatic raising. Linux/glibc only; elsewhere this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

_M_MMAP_THRESHOLD = -3  # mallopt parameter number (malloc.h)


def set_malloc_mmap_threshold(megabytes: float | None) -> bool:
    """Serve allocations of at least ``megabytes`` with their own mmap (returned to the system when freed).

    ``None`` or 0 leaves glibc's default (a dynamic threshold). Returns whether the setting took effect.
    """
    if not megabytes:
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    ok = bool(mallopt(_M_MMAP_THRESHOLD, int(float(megabytes) * 2**20)))
    if ok:
        log.debug("malloc: mmap threshold fixed at %s MB", megabytes)
    return ok
