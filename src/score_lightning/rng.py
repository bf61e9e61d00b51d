"""RNG states of torch, numpy and Python as checkpoint-safe values (loadable with ``weights_only=True``),
and :func:`preserved_rng`, which keeps work that builds a cached input out of the run's random stream."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch


def rng_state() -> dict:
    """Tensors and plain types only, so checkpoints load with ``torch.load(weights_only=True)``."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_py = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "python": {"version": version, "internal": list(internal), "gauss": gauss_py},
    }


@contextmanager
def preserved_rng() -> Iterator[None]:
    """Run a block without disturbing the global torch (CPU and CUDA) / numpy / Python RNG nor ``PL_GLOBAL_SEED``.

    Why: a run seeds once, then builds what its cache lacks (the SFT cold start, a GGUF conversion, a
    LoRA cold start's install). Whatever those draw must not move the run's stream, or a fresh cache
    samples differently from a warm one under the same seed.
    """
    torch_state = torch.get_rng_state()
    cuda_state = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    np_state = np.random.get_state()
    py_state = random.getstate()
    env = os.environ.get("PL_GLOBAL_SEED")
    try:
        yield
    finally:
        torch.set_rng_state(torch_state)
        if cuda_state is not None:
            torch.cuda.set_rng_state_all(cuda_state)
        np.random.set_state(np_state)
        random.setstate(py_state)
        if env is None:
            os.environ.pop("PL_GLOBAL_SEED", None)
        else:
            os.environ["PL_GLOBAL_SEED"] = env


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss"]))


def seed_rank(seed: int, rank: int) -> None:
    """Decorrelate sampling across data-parallel ranks; rank 0 keeps the single-process stream."""
    s = int(seed) + 1_000_003 * int(rank)
    torch.manual_seed(s)
    np.random.seed(s % 2**32)
    random.seed(s)


def seed_request(seed: int, step: int) -> int:
    """Seed torch, numpy and Python from ``(seed, step)`` alone: the asynchronous rollout worker does this
    before generating step ``step``'s batch, so that batch is a pure function of the seed, the step and
    the weights it was sampled with, whatever the worker generated before (exact resume)."""
    words = np.random.SeedSequence([int(seed), int(step), 0x5C0BE]).generate_state(2)
    s = (int(words[0]) << 32 | int(words[1])) & (2**63 - 1)
    torch.manual_seed(s)
    np.random.seed(int(words[0]))
    random.seed(s)
    return s
