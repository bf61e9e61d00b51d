"""``GenerateConfig``: what ``scripts/evaluate.py generate`` takes, in a module of its own.

Both the generation loop (:mod:`~score_lightning.evaluation.generate`) and the engine and retriever
builders (:mod:`~score_lightning.evaluation.engines`) read it; keeping it here lets each import it
without importing the other.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from score_lightning.evaluation.settings import normalise_state, settings_path_for, template_label


@dataclass
class GenerateConfig:
    """Everything ``scripts/evaluate.py generate`` takes; defaults follow ``experiment=qwen_score``.

    The CLI fills the solver, prompt and reward fields from the checkpoint's ``run_config.json``
    (:mod:`~score_lightning.evaluation.settings`); :meth:`settings` is what gets recorded and compared.
    """

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
    samples: int = 1  # rollouts per query; the article file holds sample 0, the sources file all of them
    conclusion_line: bool = True  # solver.conclusion_line: the prompt asks for a final "Conclusion:" line
    harness_state: dict | None = None  # harness.initial_state (None: the HarnessState() defaults)
    citations: str = "any"  # reward.citations: the rule reward_valid follows (any | retrieved)
    require_citation: bool = False  # reward.require_citation
    min_answer_chars: int = 20  # reward.min_answer_chars: the answer-length rule of every validity field
    agent: str = "react"  # solver.agent: react | mams (rolled out by its search / state / report roles) | rubricem
    mams: dict | None = None  # solver.mams: MaMs's role budgets (agent=mams)
    settings_source: str | None = None  # the run_config.json the settings came from (recorded only)
    batch_size: int = 8
    seed: int = 0
    dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 on CPU
    device: str = "auto"
    progress: bool = True

    @property
    def sources_path(self) -> Path:
        return Path(self.sources) if self.sources else sources_path_for(self.out)

    @property
    def settings_path(self) -> Path:
        return settings_path_for(self.out)

    def settings(self) -> dict[str, Any]:
        """What this generation is conditioned on, keyed by config name (cards compare these)."""
        return {
            "solver.max_tool_calls": self.max_tool_calls, "solver.max_response_tokens": self.max_response_tokens,
            "solver.max_observation_tokens": self.max_observation_tokens, "solver.topk": self.topk,
            "solver.temperature": float(self.temperature), "solver.top_p": float(self.top_p),
            "solver.conclusion_line": bool(self.conclusion_line),
            "harness.initial_state": normalise_state(self.harness_state),
            "model.chat_template": template_label(self.chat_template),
            "reward.citations": self.citations, "reward.require_citation": bool(self.require_citation),
            "reward.min_answer_chars": int(self.min_answer_chars),
            **({"solver.agent": self.agent, "solver.mams": dict(self.mams or {})} if self.agent == "mams" else {}),
            **({"solver.agent": self.agent} if self.agent == "rubricem" else {}),
        }


def sources_path_for(out: str | os.PathLike) -> Path:
    """The default companion file of an article file: ``<out>.sources.jsonl``."""
    out = Path(out)
    return out.with_name(out.name + ".sources.jsonl")
