"""Supervised cold start (SFT) before SCORE: synthetic demonstrations, a small trainer and a cache.

``run_sft(cfg, model_path) -> Path`` is what ``training.maybe_run_sft`` calls when ``sft.enabled``.
The import is lazy so ``score_lightning.sft.demos`` can be used without Lightning.
"""

from __future__ import annotations

from pathlib import Path


def run_sft(cfg, model_path: str) -> Path:
    """Build demonstrations, fine-tune ``model_path`` on them (or reuse the cache); return the checkpoint dir."""
    from score_lightning.sft.run import run_sft as _run_sft

    return _run_sft(cfg, model_path)


__all__ = ["run_sft"]
