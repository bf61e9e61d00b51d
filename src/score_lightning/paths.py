"""File locations a run config resolves to, usable without importing the training entry point.

``training`` and ``sft`` both need the BM25 corpus file; keeping the lookup here lets ``sft``
hash it without importing ``training`` (which itself imports ``sft``).
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

#: ``configs/`` of the checkout this package runs from (scripts compose presets from it)
CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


def corpus_path(cfg: DictConfig) -> Path:
    """The BM25 corpus file: ``retriever.corpus_path`` when set, else the stdlib corpus cached under ``paths.cache_dir``."""
    from score_lightning.data.corpus import default_corpus_path

    if cfg.retriever.corpus_path:
        return Path(cfg.retriever.corpus_path)
    return default_corpus_path(Path(cfg.paths.cache_dir) / "corpus")
