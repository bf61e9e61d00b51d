"""``rubric=evolving``: RLER's evolving rubrics (DR Tulu) as a rubric source.

A per-query buffer of natural-language items, each with a weight and a sign:

* **initialisation**, the first time a query is seen: the writer reads what a search of the corpus
  returns for the query (its top passages) and writes ``init_items`` items;
* **evolution**, on every later visit: the writer contrasts the best and the worst report of the
  query's previous rollouts under the current items, each with the passages its searches returned, and adds
  ``new_items`` items;
* **pruning**, after each scoring: items whose scores did not vary across the K rollouts (std 0)
  are dropped, and the buffer keeps the ``max_items`` (K_max) items with the largest score std.

The writer is the evaluator role (its item tokens are trained by REINFORCE on the evaluator reward
of its query) or an external OpenAI-compatible model (``writer=external``; nothing to train).
Simplified from DR Tulu: new items are scored from the step they are written in and pruned with
the others after that step's scoring; the buffer is saved in checkpoints and resumes exactly.

``evolve=false`` is DR Tulu's ablation "initial rubrics only": each query's items are written once, on its
first visit, and then kept as they are (no contrast items, no pruning).

Each data-parallel rank holds the buffers of its own queries, so the ``rubric/*`` scalars are pooled over
ranks (sums and counts summed, then divided: :func:`~score_lightning.distributed.pooled_mean`) before they are logged as the step's.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from score_lightning import distributed as D
from score_lightning.rewards.citations import cited_ids
from score_lightning.roles.evidence import EvidenceDoc
from score_lightning.roles.rubric import fallback_rubric
from score_lightning.step.rubric_source import RubricContext
from score_lightning.methods.rler.item_writer import external_writer, generate_items
from score_lightning.step.types import StepRubric
from score_lightning.methods.rler.items import (
    Item, checked_items, contrast_messages, init_messages, items_rubric, parse_items,
)
from score_lightning.step.types import RubricSample

log = logging.getLogger(__name__)


@dataclass
class _Entry:
    items: list[Item] = field(default_factory=list)
    best: str = ""
    worst: str = ""
    best_passages: str = ""  # what the best report's searches returned (the contrast prompt shows it)
    worst_passages: str = ""


@dataclass
class EvolvingRubrics:
    max_items: int = 5  # K_max
    init_items: int = 4
    new_items: int = 2
    max_tokens: int = 256  # item-writing generation budget
    passages: int = 3  # search results shown to the writer at initialisation
    max_report_chars: int = 1200  # best / worst report excerpts in the contrast prompt
    max_passage_chars: int = 200  # each passage a contrasted report's searches returned, in the contrast prompt
    max_passages: int = 4  # passages per contrasted report (its cited ones first)
    evolve: bool = True  # false: the initial items only (DR Tulu's ablation): no contrast items, no pruning
    writer: str = "evaluator"  # evaluator | external
    external: dict | None = None  # ChatClient settings (base_url, model, api_key_env, ...) for writer=external
    buffer: dict[str, _Entry] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._client = external_writer(self.writer, self.external)

    @property
    def trains_evaluator(self) -> bool:
        return self.writer == "evaluator"

    # ------------------------------------------------------------------ before the rollouts
    def step_rubrics(self, ctx: RubricContext, queries: Sequence[str], query_ids: Sequence[str],
                     evidence: Sequence[Sequence[EvidenceDoc]]) -> StepRubric:
        prompts, owners = [], []
        for qi, (q, qid) in enumerate(zip(queries, query_ids)):
            entry = self.buffer.get(str(qid))
            if entry is None:
                hits = ctx.retriever.search([q], self.passages)[0] if self.passages else []
                prompts.append(init_messages(q, [f"[{h.id}] {h.text[:300]}" for h in hits], self.init_items))
            elif self.evolve and entry.best and entry.worst:
                prompts.append(contrast_messages(q, entry.items, entry.best, entry.worst, self.new_items,
                                                 entry.best_passages, entry.worst_passages))
            else:
                continue
            owners.append(qi)
        texts, records = self._write(ctx, prompts)
        added, failed, samples = 0, 0, []
        for qi, text, record in zip(owners, texts, records):
            entry = self.buffer.setdefault(str(query_ids[qi]), _Entry())
            parsed = parse_items(text)
            known = {it.text for it in entry.items}
            fresh = [it for it in parsed.items if it.text not in known]
            entry.items.extend(fresh)
            added += len(fresh)
            failed += int(not parsed.items)
            if record is not None:  # the evaluator wrote it: REINFORCE trains these tokens
                prompt, resp, mask, cut, lps = record
                rubric = items_rubric(parsed.items) if parsed.items else fallback_rubric(ctx.state)
                samples.append(RubricSample(rubric, bool(parsed.items), parsed.error, prompt, resp, mask, cut, lps))
            else:
                samples.append(None)
        out_samples = [(s, [qi]) for qi, s in zip(owners, samples) if s is not None]
        per_query, fallback = [], []
        for qid in query_ids:
            entry = self.buffer.get(str(qid))
            if entry is None or not entry.items:
                per_query.append(fallback_rubric(ctx.state))  # no item yet: the harness rubric, counted
                fallback.append(True)
            else:
                per_query.append(items_rubric(entry.items))
                fallback.append(False)
        stats = {"rubric/items_added": D.global_sum(added),  # over ranks, as every rubric/* scalar
                 "rubric/write_fail_rate": D.pooled_mean(failed, len(owners), 0.0)}
        return StepRubric(per_query, out_samples, not any(fallback), "no rubric items" if any(fallback) else "",
                          stats, fallback)

    def _write(self, ctx: RubricContext, prompts: list[list[dict]]) -> tuple[list[str], list[tuple | None]]:
        """Item texts from the writer, with the evaluator's (prompt ids, response ids, train mask, truncated).

        The engine is called even with no prompt: a collective engine (FSDP) needs every rank.
        """
        if self._client is not None:
            outcomes = [self._client.ask(m, checked_items) for m in prompts]
            return [o.value if o.ok else "" for o in outcomes], [None] * len(prompts)
        return generate_items(ctx, prompts, self.max_tokens)

    # ------------------------------------------------------------------ after the scoring
    def observe(self, ctx: RubricContext, queries: Sequence[str], query_ids: Sequence[str],
                item_scores: Sequence[Any], reports: Sequence[Sequence[str | None]],
                rewards: Sequence[Sequence[float]],
                passages: Callable[[], list[list[dict[str, str]]]] | None = None) -> dict[str, float]:
        """Prune by score spread and keep the best / worst reports, with the passages their searches returned
        (``passages()``: per query, per report, id -> text), for the next visit's contrast. The step passes the
        judged reports only (``step/judged_rows.py``); a query with fewer than two is left as it was."""
        removed, stds = 0, []
        if not self.evolve:  # the initial items stay as written
            sizes = [len(self.buffer[str(q)].items) for q in query_ids if str(q) in self.buffer]
            return {"rubric/items_removed": 0.0, "rubric/buffer_size": D.pooled_mean(sum(sizes), len(sizes), 0.0)}
        shown = None
        for qi, (qid, scores, group, r) in enumerate(zip(query_ids, item_scores, reports, rewards)):
            entry = self.buffer.get(str(qid))
            if entry is None or not entry.items or scores is None or scores.shape[1] != len(entry.items):
                continue
            if scores.shape[0] < 2:  # fewer than two judged reports: no spread to prune by, no contrast to draw
                continue
            spread = score_spread(scores)
            ranked = sorted((j for j in range(len(entry.items)) if spread[j] > 0), key=lambda j: -spread[j])
            keep = sorted(ranked[: self.max_items])
            removed += len(entry.items) - len(keep)
            stds.extend(spread[j] for j in keep)
            entry.items = [entry.items[j] for j in keep]
            order = sorted(range(len(r)), key=lambda k: r[k])
            best, worst = group[order[-1]], group[order[0]]
            if best and worst and r[order[-1]] > r[order[0]]:
                entry.best, entry.worst = best[: self.max_report_chars], worst[: self.max_report_chars]
                if passages is not None:
                    shown = passages() if shown is None else shown
                    entry.best_passages = self._passages(best, shown[qi][order[-1]])
                    entry.worst_passages = self._passages(worst, shown[qi][order[0]])
        sizes = [len(self.buffer[str(q)].items) for q in query_ids if str(q) in self.buffer]
        return {"rubric/items_removed": D.global_sum(removed),
                "rubric/buffer_size": D.pooled_mean(sum(sizes), len(sizes), 0.0),
                "rubric/item_std_mean": D.pooled_mean(sum(stds), len(stds), math.nan)}

    def _passages(self, report: str, found: dict[str, str]) -> str:
        """``[id] text`` lines of what a report's searches returned: the ids it cites first, then the rest."""
        cites = set(cited_ids(report, known_ids=set(found)))  # as the reward reads citations
        cited = [d for d in found if d in cites]
        ids = (cited + [d for d in found if d not in cited])[: self.max_passages]
        return "\n".join(f"[{d}] {found[d][: self.max_passage_chars]}" for d in ids)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return {qid: {"items": [[it.text, it.weight, it.negative] for it in e.items], "best": e.best, "worst": e.worst,
                      "best_passages": e.best_passages, "worst_passages": e.worst_passages}
                for qid, e in self.buffer.items()}

    def load_state_dict(self, state: dict) -> None:
        self.buffer = {qid: _Entry([Item(t, float(w), bool(n)) for t, w, n in e["items"]], e.get("best", ""),
                                   e.get("worst", ""), e.get("best_passages", ""), e.get("worst_passages", ""))
                       for qid, e in state.items()}


def score_spread(scores: torch.Tensor) -> list[float]:
    """Population std of each item's scores over the K reports (the pruning key)."""
    return scores.float().std(dim=0, unbiased=False).tolist()
