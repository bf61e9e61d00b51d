"""``GenerateConfig``: what ``scripts/evaluate.py generate`` takes, in a module of its own.

Both the generation loop (:mod:`~score_lightning.evaluation.generate`) and the engine and retriever
builders (:mod:`~score_lightning.evaluation.engines`) read it; keeping it here lets each import it
without importing the other.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class GenerateConfig:
    """Everything ``scripts/evaluate.py generate`` takes; defaults follow ``experiment=qwen_score``."""

    model: str
    queries: str
    out: str
    sources: str | None = None  # default: <out>.sources.jsonl
    limit: int | None = None
    engine: str = "hf"  # hf | vllm
    engine_kwargs: dict = field(default_factory=dict)  # extra VLLMEngine keyword arguments
    retriever: str = "bm25"  # bm25 | http
    chat_template: str | None = None  # for a checkpoint without one (an export carries the training run's)
    split: str | None = None  # only this split of a query file that marks one ("heldout": the evaluation queries)
    retriever_url: str | None = None
    corpus: str | None = None  # bm25 corpus; default: the embedded stdlib corpus
    index_dir: str | None = None  # bm25 index cache; default: built in memory
    max_tool_calls: int = 10
    max_response_tokens: int = 4096
    max_observation_tokens: int = 512
    topk: int = 3
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    batch_size: int = 8
    seed: int = 0
    dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 on CPU
    device: str = "auto"
    progress: bool = True

    @property
    def sources_path(self) -> Path:
        return Path(self.sources) if self.sources else sources_path_for(self.out)


def sources_path_for(out: str | os.PathLike) -> Path:
    """The default companion file of an article file: ``<out>.sources.jsonl``."""
    out = Path(out)
    return out.with_name(out.name + ".sources.jsonl")
