"""Synthetic demonstrations for the supervised cold start, in the exact token format RL samples.

Three kinds, all built from the query set and the configured retriever (BM25 over the stdlib corpus
by default), deterministic given a seed; each kind lives in its own module:

* **solver** (:mod:`~score_lightning.sft.solver_demos`): searches answered by real observations,
  then a cited ``<answer>`` ending with ``Conclusion: ...`` (with ``sft.report``, a research report:
  several searches, an overview, several cited findings, a synthesis).
* **rubric** (:mod:`~score_lightning.sft.rubric_demos`): a ``<dimensions>`` block satisfying a
  random valid harness state, in a canonical order a tiny model can learn.
* **scoring** (:mod:`~score_lightning.sft.scoring_demos`): verification searches, then
  ``<report_evaluations>`` whose scores follow the known quality of K reports.

Multi-turn responses are produced by running the project's own agent loop with a scripted engine
(:mod:`~score_lightning.sft.context`), so observation tokens, masks (0 on observations), the
tool-budget notice and the length budget are exactly those of an RL rollout.

Budgets (prompt, response, observation, rubric and report lengths, K, topk) come from the run's
config (:class:`~score_lightning.sft.demo_types.DemoBudgets`), so the demonstrations look like what
RL will sample. A demo that does not fit is shortened and, failing that, dropped (counted in
:class:`~score_lightning.sft.demo_types.DemoStats`). This module draws the prompts of every kind
from one seeded stream per kind and numbers them into groups.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence

from score_lightning.harness.state import HarnessState
from score_lightning.retrieval.base import Retriever
from score_lightning.sft.context import DemoContext
from score_lightning.sft.demo_types import (
    RUBRIC, SCORING, SOLVER, Demo, DemoBudgets, DemoStats, KIND_WEIGHTS, ReportShape,
)
from score_lightning.sft.rubric_demos import rubric_group
from score_lightning.sft.scoring_demos import scoring_group
from score_lightning.sft.solver_demos import solver_group
from score_lightning.sft.demo_registry import ExtraKind

log = logging.getLogger(__name__)

#: Bump whenever the generated demonstrations change, so cached SFT checkpoints are rebuilt.
DEMO_VERSION = 8  # 7: scoring demos for either protocol (pointwise, show_retrieved); 8: rubric prompts list D_q^0
                  # with titles / opening words, as RL's do


class DemoBuilder:
    """Builds the three demo kinds for one tokenizer, retriever, query set and budget."""

    def __init__(self, tokenizer, retriever: Retriever, queries: Sequence[str], budgets: DemoBudgets,
                 base_state: HarnessState | None = None, seed: int = 0, report: ReportShape | None = None,
                 items: dict[str, list] | None = None):
        self.ctx = DemoContext.create(tokenizer, retriever, queries, budgets, base_state, report, items)
        self.seed = int(seed)
        self.stats = DemoStats()

    def build(self, n_solver: int, n_rubric: int, n_scoring: int,
              per_prompt: dict[str, int] | None = None, extra: Sequence[ExtraKind] = (),
              scoring_contrast: float = 0.0, scoring_weights: tuple[float, ...] | None = None) -> list[Demo]:
        """About ``n_*`` demos per kind, in groups of ``per_prompt[kind]`` responses sharing one prompt.

        ``extra`` registers the methods' kinds (:mod:`~score_lightning.sft.workflow_demos`),
        built after the default three, which stay byte-identical. ``scoring_contrast``: the share of scoring
        prompts built as contrast groups (:func:`~score_lightning.sft.scoring_demos.scoring_group`);
        ``scoring_weights``: the draw weight of each report kind in the others (None: the defaults).

        Deterministic given the seed; a kind's demos do not depend on the other kinds' counts. The
        ``group`` field numbers the prompts (the trainer runs each prompt once for its whole group).
        """
        ctx = self.ctx
        per = {SOLVER: 1, RUBRIC: 1, SCORING: 1, **(per_prompt or {}), **{x.kind: x.per_prompt for x in extra}}
        builders = {x.kind: x.group for x in extra}
        demos: list[Demo] = []
        group = 0
        for kind, n in ((SOLVER, n_solver), (RUBRIC, n_rubric), (SCORING, n_scoring), *((x.kind, x.n) for x in extra)):
            rng = random.Random(f"{self.seed}-{kind}-{DEMO_VERSION}")
            size = max(1, int(per[kind]))
            n_prompts = -(-n // size) if n > 0 else 0
            got = tries = 0
            while got < n_prompts and tries < 3 * n_prompts + 10:
                tries += 1
                sub = random.Random(rng.random())
                query = ctx.queries[(tries - 1) % len(ctx.queries)] if sub.random() < 0.5 else sub.choice(ctx.queries)
                if kind == SOLVER:
                    ds = solver_group(ctx, sub, query, size)
                elif kind == RUBRIC:
                    ds = rubric_group(ctx, sub, size)
                elif kind == SCORING:
                    ds = scoring_group(ctx, sub, query, size, scoring_contrast, scoring_weights or KIND_WEIGHTS)
                else:
                    ds = builders[kind](ctx, sub, query, size)
                self.stats.dropped[kind] = self.stats.dropped.get(kind, 0) + max(0, size - len(ds))
                if not ds:
                    continue
                for d in ds:
                    d.group = group
                demos.extend(ds)
                group += 1
                got += 1
                self.stats.built[kind] = self.stats.built.get(kind, 0) + len(ds)
            if got < n_prompts:
                log.warning("sft demos: built %d/%d %s prompts (the rest did not fit the budgets)", got, n_prompts, kind)
        return demos


def build_demos(tokenizer, retriever: Retriever, queries: Sequence[str], budgets: DemoBudgets,
                n_solver: int, n_rubric: int, n_scoring: int, seed: int = 0,
                base_state: HarnessState | None = None,
                per_prompt: dict[str, int] | None = None,
                extra: Sequence[ExtraKind] = (), scoring_contrast: float = 0.0,
                report: ReportShape | None = None, scoring_weights: tuple[float, ...] | None = None,
                items: dict[str, list] | None = None) -> tuple[list[Demo], DemoStats]:
    """Build all demonstrations; returns them (solver, rubric, scoring, then ``extra`` kinds) and the counts.

    ``report`` (``sft.report``) makes solver answers and scoring reports research reports of that shape;
    ``items`` (``sft.scoring_targets=items``: evidence items by question) makes valid reports' scores follow them.
    """
    builder = DemoBuilder(tokenizer, retriever, queries, budgets, base_state, seed, report, items)
    demos = builder.build(n_solver, n_rubric, n_scoring, per_prompt, extra, scoring_contrast, scoring_weights)
    return demos, builder.stats


def demo_summary(demos: Sequence[Demo]) -> dict[str, float]:
    """Counts and mean lengths per kind, for logs and the cache's metadata."""
    out: dict[str, float] = {}
    for kind in dict.fromkeys([SOLVER, RUBRIC, SCORING, *(d.kind for d in demos)]):
        ds = [d for d in demos if d.kind == kind]
        out[f"{kind}/count"] = float(len(ds))
        if ds:
            out[f"{kind}/prompt_len_mean"] = sum(len(d.prompt_ids) for d in ds) / len(ds)
            out[f"{kind}/response_len_mean"] = sum(len(d.response_ids) for d in ds) / len(ds)
            out[f"{kind}/response_len_max"] = float(max(len(d.response_ids) for d in ds))
            out[f"{kind}/trained_tokens_mean"] = sum(sum(d.response_mask) for d in ds) / len(ds)
            if kind != RUBRIC:
                out[f"{kind}/tool_calls_mean"] = sum(d.meta.get("tool_calls", 0) for d in ds) / len(ds)
    return out

