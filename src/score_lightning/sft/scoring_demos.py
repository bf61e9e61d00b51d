"""Scoring demos: the evaluator verifying and scoring reports of known, mixed quality.

Prompt: :func:`scoring_messages` over K reports (``evaluator.scoring=joint``) or over one report
(``pointwise``), solver-style answers, some deliberately degraded: no citations, invented citations,
citations of real documents the report's searches never returned, off-topic, cut short, missing (the edits of
:mod:`score_lightning.rewards.report_edits`, which ``scripts/bench_evaluator.py`` measures the evaluator on). With
``evaluator.show_retrieved`` each report comes with the ids its searches returned, and the
verification says whether its citations are among them. Response: verification ``<search>`` calls
with real observations, then ``<report_evaluations>`` with ``<verification>``, ``<gap_analysis>`` and
integer scores that follow report quality, then EOS. Because each report's quality is known when it
is written, the scores can rank them correctly, which is what the evaluator has to learn.
"""

from __future__ import annotations

import random

from score_lightning import protocol as P
from score_lightning.harness.state import HarnessState
from score_lightning.rewards.items import item_recall
from score_lightning.rewards.report_edits import (
    bracketed_ids, cut_short, drop_citations, invented_id, replace_citation, unretrieved_id,
)
from score_lightning.roles.cited_passages import cited_passages, corpus_texts
from score_lightning.roles.prompts import scoring_messages
from score_lightning.roles.rubric import Rubric, fallback_rubric
from score_lightning.sft.context import DemoContext
from score_lightning.rollout.chat import encode_chat, truncate_text
from score_lightning.sft.demo_types import KIND_WEIGHTS, SCORING, SCORING_KINDS, Demo
from score_lightning.sft.rubric_demos import random_rubric, random_state
from score_lightning.sft.solver_demos import answer_for, claim_count, search_count, solver_plan, visible_evidence
from score_lightning.roles.text import query_entities, search_queries

#: base score per report quality kind (every kind a demo draws has one)
_BASE_SCORES = {"good": 8, "partial": 6, "no_citation": 4, "fake_citation": 3, "unretrieved_citation": 3,
                "truncated": 4, "off_topic": 2, "empty": 0}
assert set(_BASE_SCORES) == set(SCORING_KINDS)
#: kinds of valid reports: under ``sft.scoring_targets=items`` their base score follows their item recall
_VALID_KINDS = ("good", "partial")
#: kinds whose citations are not grounded in the report's own searches
_UNGROUNDED = ("fake_citation", "unretrieved_citation")
#: the edits of a contrast group (``sft.scoring_contrast``): each report is the group's one good report with
#: one flaw (its citations dropped, invented or never retrieved, cut short, fewer sections), or another query's
_CONTRAST_KINDS = ("good", "partial", "no_citation", "fake_citation", "unretrieved_citation", "truncated", "off_topic")


def _sources(ctx: DemoContext, hits: list) -> list[str]:
    """The ids a solver with these searches retrieved: those its observations showed."""
    return list(dict.fromkeys(e.doc_id for hs in hits for e in visible_evidence(ctx.tok, hs, ctx.b.max_observation_tokens)))


def _report(ctx: DemoContext, rng: random.Random, query: str, rubric: Rubric, kind: str) -> tuple[str, dict]:
    """One report of a given quality ``kind``, the features its scores depend on, and its ``sources``."""
    if kind == "empty":  # the solver searched (or not) and never closed its answer
        sources = _sources(ctx, solver_plan(ctx, rng, query, rng.randint(1, 2))[1]) if rng.random() < 0.5 else []
        return "(no report)", {"kind": kind, "cited": [], "sources": sources}
    if kind == "off_topic":
        other = rng.choice([q for q in ctx.queries if q != query] or [query])
        _, hits = solver_plan(ctx, rng, other, search_count(ctx, rng, 1, 2))
        text = answer_for(ctx, rng, other, hits, rubric, claim_count(ctx, rng, 2))
        return text or "(no report)", {"kind": kind, "cited": bracketed_ids(text), "sources": _sources(ctx, hits)}
    _, hits = solver_plan(ctx, rng, query, search_count(ctx, rng, 1, 3))
    sources = _sources(ctx, hits)
    text = answer_for(ctx, rng, query, hits, rubric, claim_count(ctx, rng, 3) if kind != "partial" else 1)
    if not text:
        return "(no report)", {"kind": "empty", "cited": [], "sources": sources}
    if kind == "no_citation":
        text = drop_citations(text)
    elif kind in _UNGROUNDED:
        cited = bracketed_ids(text)
        if cited:
            if kind == "fake_citation":  # an invented id, e.g. json.helper
                other = invented_id(cited[0], rng)
            else:  # a real corpus document that these searches did not return
                other = unretrieved_id(rng, ctx.known_ids, sources)
            text = replace_citation(text, cited[0], other)
    elif kind == "truncated":
        text = cut_short(text)
    cited = bracketed_ids(text)
    if kind in _UNGROUNDED and all(c in sources for c in cited):
        kind = "good"  # nothing to replace (no citation survived): the report is what it is
    feat = {"kind": kind, "cited": cited, "sources": sources}
    items = (ctx.items or {}).get(query.strip())
    if items and kind in _VALID_KINDS:
        feat["recall"] = item_recall(items, text, sources, True)
    return text, feat


def recall_base(recall: float) -> int:
    """A valid report's base score under ``sft.scoring_targets=items``: 5 + round(4 · recall), from 5 (none of its
    query's evidence items) to 9 (all); every degraded kind stays at 4 or below, so valid still outranks invalid.
    The research-report demos' recalls spread over 0-1 (0.17, 0.33, 0.5, 0.67 most often), so the scale spans them."""
    return 5 + int(round(4 * recall))


def _scores(rng: random.Random, feat: dict, rubric: Rubric, confirmed: set[str]) -> list[int]:
    """Per-dimension 0..10 scores: the kind's base and the dimension's view of the report (deterministic)."""
    kind = feat["kind"]
    base = recall_base(feat["recall"]) if feat.get("recall") is not None else _BASE_SCORES[kind]
    out = []
    for d in rubric.dims:
        if kind == "empty":
            out.append(0)
            continue
        v = base  # no jitter: the same report gets the same scores, a mapping a small model can learn
        if d in ("citation_grounding", "factual_support"):
            if kind == "no_citation" or kind in _UNGROUNDED:
                v -= 2
            elif any(c in confirmed for c in feat["cited"]):
                v += 1
        if d in ("comprehensiveness", "evidence_coverage") and kind in ("partial", "truncated"):
            v -= 1
        if d == "conciseness" and kind in ("partial",):
            v += 1
        out.append(int(min(10, max(0, v))))
    return out


def _reason(v: int) -> str:
    """A one-word reason (the parser ignores it; short keeps K x k scores inside the budget)."""
    if v == 0:
        return "missing"
    return "strong" if v >= 8 else "good" if v >= 6 else "weak" if v >= 4 else "poor"


def _verification(feat: dict, confirmed: set[str], known_ids: frozenset[str], show_retrieved: bool) -> str:
    """What the evidence showed about the report's citations: with ``show_retrieved``, whether they are
    among the ids the report's searches returned (shown in the prompt); else what the evaluator's own
    searches found about the first one."""
    kind, cited = feat["kind"], feat["cited"]
    if kind == "empty":
        return "No report."
    if kind == "off_topic":
        return "Off-topic."
    if not cited:
        return "No citations."
    if show_retrieved:
        missing = [c for c in cited if c not in feat["sources"]]
        return f"[{missing[0]}] never retrieved." if missing else f"[{cited[0]}] retrieved."
    c = cited[0]
    if c in confirmed:
        return f"[{c}] found by search."
    if c not in known_ids and known_ids:
        return f"[{c}] not found."
    return f"[{c}] not re-checked."


def _gap(query: str, text: str, feat: dict, known_ids: frozenset[str]) -> str:
    """The report's main gap: missing, off-topic, cut short, or a name of the question it never mentions."""
    kind = feat["kind"]
    if kind == "empty":
        return "Everything."
    if kind == "off_topic":
        return "Does not answer the question."
    if kind == "truncated":
        return "No conclusion."
    missing = [e for e in query_entities(query, known_ids) if e not in text]
    if missing:
        return f"Misses {missing[0]}."
    return "None."


def _citations(ctx: DemoContext, reports: list[str], feats: list[dict]) -> list | None:
    """Per report, the passages it cites as the rollout shows them under ``evaluator.show_passages`` (the corpus'
    text, cut to ``evaluator.passage_tokens``); None when it is off."""
    if ctx.b.passages is None:
        return None
    tokens, limit = ctx.b.passages
    corpus = corpus_texts(ctx.retriever.inner)
    if corpus is None:
        raise ValueError("evaluator.show_passages: the cold start's scoring demos read each cited passage from the "
                         "retriever's local corpus, and this retriever has none (retriever=bm25 holds one)")
    cut = lambda text: truncate_text(ctx.tok, text, tokens)  # noqa: E731
    return [cited_passages(r, f["sources"], corpus, limit, cut) for r, f in zip(reports, feats)]


def scoring_group(ctx: DemoContext, rng: random.Random, query: str, n: int, contrast: float = 0.0,
                  weights: tuple[float, ...] = KIND_WEIGHTS) -> list[Demo]:
    """``n`` evaluations of one scoring prompt: K reports of mixed quality (joint), or one (pointwise).

    ``contrast`` (joint only): the share of prompts whose K reports are one report and its minimal edits, so
    the scores must follow the one thing that differs (a grounded citation, the topic, the conclusion), not
    the wording; 0 draws every prompt as before, from the same random stream. ``weights``: each kind's draw
    weight (:func:`kind_weights`) in the other prompts."""
    b = ctx.b
    state = random_state(rng, ctx.base, b.evaluator_max_tool_calls)
    rubric = fallback_rubric(state) if rng.random() < 0.3 else random_rubric(rng, state)
    pointwise = b.scoring == "pointwise"
    K = 1 if pointwise else b.num_rollouts if rng.random() < 0.75 else rng.randint(2, max(3, b.num_rollouts + 1))
    base = None
    if contrast > 0 and not pointwise and rng.random() < contrast:
        base = rng.random()  # every report starts from the same searches and answer
        kinds = ["good", *rng.sample(_CONTRAST_KINDS[1:], k=min(K - 1, len(_CONTRAST_KINDS) - 1))]
        kinds += rng.choices(_CONTRAST_KINDS, k=K - len(kinds))
        rng.shuffle(kinds)
    else:
        kinds = rng.choices(SCORING_KINDS, weights=weights, k=K)
    reports, feats = [], []
    for kind in kinds:
        text, feat = _report(ctx, random.Random(rng.random() if base is None else base), query, rubric, kind)
        reports.append(truncate_text(ctx.tok, text, b.max_report_tokens))
        feats.append(feat)
    sources = [f["sources"] for f in feats] if b.show_retrieved else None
    prompt = encode_chat(ctx.tok, scoring_messages(query, reports, rubric, state, sources, pointwise=pointwise,
                                                   cited=_citations(ctx, reports, feats)))
    if len(prompt) > b.max_prompt_tokens:
        return []
    out = []
    for _ in range(n):
        d = _scoring_response(ctx, random.Random(rng.random()), query, state, rubric, reports, feats, prompt)
        if d is not None:
            out.append(d)
    return out


def _scoring_response(ctx: DemoContext, rng: random.Random, query: str, state: HarnessState, rubric: Rubric,
                      reports: list[str], feats: list[dict], prompt: list[int]) -> Demo | None:
    """One scripted evaluation; shorter (optional blocks, then reasons dropped) on each retry."""
    b = ctx.b
    K = len(reports)
    pc = state.process_constraints
    # verification searches: at least the harness minimum and >= 1 (the reward verifier needs depth)
    n_min = max(1, pc.min_number_of_tool_call) if b.evaluator_max_tool_calls > 0 else 0
    n_search = min(b.evaluator_max_tool_calls, max(n_min, rng.choice((1, 1, 2))))
    cited_all = [c for f in feats for c in f["cited"] if f["kind"] != "off_topic"]
    for attempt in range(3):
        sub = random.Random(rng.random())
        qs: list[str] = []
        if n_search:
            if cited_all and sub.random() < 0.5:
                qs.append(sub.choice(cited_all))
            for q in search_queries(sub, query, n_search, ctx.known_ids):
                if len(qs) < n_search and q not in qs:
                    qs.append(q)
        hits = ctx.retriever.search(qs, b.topk) if qs else []
        confirmed = {e.doc_id for hs in hits for e in visible_evidence(ctx.tok, hs, b.max_observation_tokens)}
        short = attempt >= 1
        blocks = []
        for i, (text, feat) in enumerate(zip(reports, feats), 1):
            scores = _scores(sub, feat, rubric, confirmed)
            parts = [f'<report id="{i}">']
            if pc.require_verification or not short:
                parts.append(f"{P.VERIFICATION_OPEN}{_verification(feat, confirmed, ctx.known_ids, b.show_retrieved)}"
                             f"{P.VERIFICATION_CLOSE}")
            if pc.require_gap_analysis or not short:
                parts.append(f"{P.GAP_OPEN}{_gap(query, text, feat, ctx.known_ids)}{P.GAP_CLOSE}")
            sc = "".join(
                f'<score dim="{d}" value="{v}"' + ("" if attempt >= 2 else f' reason="{_reason(v)}"') + "/>"
                for d, v in zip(rubric.dims, scores)
            )
            parts.append(f"{P.SCORES_OPEN}{sc}{P.SCORES_CLOSE}{P.REPORT_CLOSE}")
            blocks.append("".join(parts))
        evals = f"{P.EVALS_OPEN}" + "\n".join(blocks) + f"{P.EVALS_CLOSE}"
        turns = []
        for j, q in enumerate(qs):
            pre = f"{P.THINK_OPEN}Check the reports' claims.{P.THINK_CLOSE}" if j == 0 and sub.random() < 0.5 else ""
            turns.append(f"{pre}{P.SEARCH_OPEN}{q}{P.SEARCH_CLOSE}")
        turns.append(evals)
        traj = ctx.script(turns, prompt, b.scoring_agent())
        if not traj.finished or traj.truncated or len(traj.response_ids) + 1 > b.evaluator_max_response_tokens:
            continue
        return Demo(SCORING, prompt, traj.response_ids + [ctx.eos], traj.response_mask + [1], meta={
            "query": query, "num_reports": K, "state": state.to_dict(),
            "rubric": [list(rubric.dims), list(rubric.weights)], "kinds": [f["kind"] for f in feats],
            "recalls": [f.get("recall") for f in feats],
            "scoring": b.scoring, "sources": [f["sources"] for f in feats] if b.show_retrieved else None,
            "search_queries": list(qs), "tool_calls": traj.tool_calls,
        })
    return None
