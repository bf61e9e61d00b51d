"""The inputs every demo kind reads (:class:`DemoContext`) and the scripted agent run that turns
pre-written turns into an RL-exact token sequence.

Solver and scoring demos are not formatted by hand: their turns are replayed through the project's
own agent loop (:func:`run_agent`) with :class:`ScriptEngine`, so observation tokens, masks, the
tool-budget notice and the length budget are exactly those of an RL rollout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from score_lightning import protocol as P
from score_lightning.harness.state import HarnessState
from score_lightning.retrieval.base import Retriever, SearchHit
from score_lightning.rollout.agent import AgentConfig, run_agent
from score_lightning.rollout.engine import Generation, SamplingParams
from score_lightning.rollout.trajectory import Trajectory
from score_lightning.sft.demo_types import DemoBudgets, ReportShape, encode


class ScriptEngine:
    """A :class:`RolloutEngine` that "generates" pre-written turns, honouring stops and budgets.

    Each call pops the next turn of the (single) trajectory being scripted; the text is tokenised
    on its own, cut after the first stop id and at ``max_new_tokens``, as a sampler would be.
    """

    def __init__(self, tokenizer, turns: Sequence[str]):
        self.tok = tokenizer
        self.turns = list(turns)

    def generate(self, prompts, params: SamplingParams) -> list[Generation]:
        out = []
        for _ in prompts:
            text = self.turns.pop(0) if self.turns else P.IM_END
            ids = encode(self.tok, text)
            finish = "length"
            for j, t in enumerate(ids):
                if t in params.stop_token_ids or t == self.tok.eos_token_id:
                    ids, finish = ids[: j + 1], "stop"
                    break
            else:
                if params.stop_strings and any(self.tok.decode(ids).endswith(s) for s in params.stop_strings):
                    finish = "stop"
            if len(ids) > params.max_new_tokens:
                ids, finish = ids[: params.max_new_tokens], "length"
            out.append(Generation(ids, None, finish))
        return out

    def sync_weights(self, named_tensors) -> None:  # pragma: no cover - protocol only
        return None


class CachedRetriever:
    """Memoises a retriever's answers per (query, topk): demos search the same strings many times."""

    def __init__(self, inner: Retriever):
        self.inner = inner
        self.cache: dict[tuple[str, int], list[SearchHit]] = {}

    def search(self, queries: list[str], topk: int) -> list[list[SearchHit]]:
        missing = [q for q in dict.fromkeys(queries) if (q, topk) not in self.cache]
        if missing:
            for q, hits in zip(missing, self.inner.search(missing, topk)):
                self.cache[(q, topk)] = list(hits)
        return [list(self.cache[(q, topk)]) for q in queries]


@dataclass(frozen=True)
class DemoContext:
    """One tokenizer, (cached) retriever, query set, budget and base harness state."""

    tok: Any
    retriever: CachedRetriever
    queries: list[str]
    b: DemoBudgets
    base: HarnessState
    #: corpus document ids (empty for retrievers that do not expose their documents)
    known_ids: frozenset[str]
    eos: int
    #: ``sft.report``: research-report solver answers (and scoring reports) of this shape; None: short answers
    report: ReportShape | None = None
    #: ``sft.scoring_targets=items``: each query's evidence items, by question text (valid reports' target scores
    #: follow their ``item_recall``); None: scores follow the report's kind alone
    items: dict[str, list] | None = None

    @classmethod
    def create(cls, tokenizer, retriever: Retriever, queries: Sequence[str], budgets: DemoBudgets,
               base_state: HarnessState | None = None, report: ReportShape | None = None,
               items: dict[str, list] | None = None) -> "DemoContext":
        kept = [q for q in queries if q.strip()]
        if not kept:
            raise ValueError("sft demos: no queries")
        docs = getattr(retriever, "docs", None) or []
        return cls(tok=tokenizer, retriever=CachedRetriever(retriever), queries=kept, b=budgets,
                   base=base_state if base_state is not None else HarnessState(),
                   known_ids=frozenset(d.id for d in docs), eos=tokenizer.eos_token_id, report=report, items=items)

    def script(self, turns: Sequence[str], prompt: list[int], agent: AgentConfig) -> Trajectory:
        """Replay ``turns`` after ``prompt`` through the real agent loop (real searches, masks, budgets)."""
        return run_agent(ScriptEngine(self.tok, turns), self.tok, [prompt], self.retriever, agent)[0]
