"""Solver demos, and the cited answers that scoring demos reuse as reports.

Prompt: the chat template of :func:`solver_messages` (a random valid rubric or the harness
fallback). Response: ``<think>``, 1..N ``<search>`` calls whose queries come from the question
(dotted stdlib names, identifiers, keywords), each answered by the *real* observation, then an
``<answer>`` citing retrieved ids as ``[doc_id]`` with sentences taken from the retrieved passages,
ending with ``Conclusion: ...``, then EOS. Only passages whose ``[id]`` survives the observation's
token budget are cited, so every citation is one the model actually saw.

With ``sft.report`` (:class:`~score_lightning.sft.demo_types.ReportShape`) the answer is a research
report (:mod:`~score_lightning.sft.research_report`) whose findings are sentences of the text the
observations actually showed, after a number of searches drawn from the shape.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from score_lightning import protocol as P
from score_lightning.harness.state import HarnessState
from score_lightning.retrieval.base import SearchHit
from score_lightning.roles.prompts import solver_messages
from score_lightning.roles.rubric import Rubric, fallback_rubric
from score_lightning.rollout.agent import format_observation
from score_lightning.sft.context import DemoContext
from score_lightning.rollout.chat import encode_chat
from score_lightning.sft.demo_types import SOLVER, Demo
from score_lightning.sft.research_report import REPORT_SENTENCE_WORDS, build_report
from score_lightning.sft.rubric_demos import random_rubric, random_state
from score_lightning.roles.text import (first_sentence, lower_first, passage_sentences, query_entities, query_keywords,
                                      search_queries)


@dataclass
class Evidence:
    """A retrieved document id and the sentence an answer may cite it for."""

    doc_id: str
    sentence: str


def visible_evidence(tokenizer, hits: list[SearchHit], budget: int) -> list[Evidence]:
    """Hits whose ``[id]`` survives the observation's token budget, with a usable sentence."""
    _, shown = format_observation(hits, budget, tokenizer)
    out = []
    for h in hits:
        if h.id not in shown:
            continue
        s = first_sentence(h.text) or f"{h.title or h.id} is documented in the standard library."
        out.append(Evidence(h.id, s))
    return out


def visible_passages(tokenizer, hits: list[SearchHit], budget: int, n: int = 3) -> list[tuple[str, list[str]]]:
    """Each shown hit's id and up to ``n`` sentences of the text the observation showed of it (what a report
    may state: nothing the budget cut off); hits with no readable sentence in view are left out."""
    ids, shown = format_observation(hits, budget, tokenizer)
    text = tokenizer.decode(ids).replace(P.OBS_CLOSE, "")
    marks = sorted((text.find(f"[{h}]"), h) for h in shown)
    out = []
    for i, (start, doc_id) in enumerate(marks):
        end = marks[i + 1][0] if i + 1 < len(marks) else len(text)
        sentences = passage_sentences(text[start + len(doc_id) + 2:end], n, REPORT_SENTENCE_WORDS)
        if sentences:
            out.append((doc_id, sentences))
    return out


def build_answer(
    rng: random.Random, query: str, evidence: list[Evidence], rubric: Rubric | None, known_ids: frozenset[str],
    max_claims: int = 3,
) -> str:
    """An answer citing ``evidence`` ids, in one of several structures, ending with ``Conclusion: ...``."""
    ents = query_entities(query, known_ids) or query_keywords(query)[:2] or ["the question"]
    ev = evidence[:max_claims]
    dims = set(rubric.dims) if rubric else set()
    style = rng.choice(("plain", "bullets", "according", "intro"))
    lines: list[str] = []
    if style == "intro" and len(ents) >= 2:
        lines.append(f"The question compares {ents[0]} with {ents[1]}.")
    elif style == "intro":
        lines.append(f"The question is about {ents[0]}.")
    claims = []
    for e in ev:
        s = e.sentence.rstrip(".")
        if style == "bullets":
            claims.append(f"- {e.doc_id}: {s} [{e.doc_id}].")
        elif style == "according":
            claims.append(f"According to [{e.doc_id}], {lower_first(s)}.")
        else:
            claims.append(f"{s} [{e.doc_id}].")
    lines.append(("\n" if style == "bullets" else " ").join(claims))
    if "practical_guidance" in dims and rng.random() < 0.7:
        lines.append(f"In practice, start with {ents[0]} and check its documentation.")
    if "uncertainty_calibration" in dims and rng.random() < 0.7:
        missing = [e for e in ents if not any(e in x.doc_id for x in ev)]
        if missing:
            lines.append(f"The retrieved passages say little about {missing[0]}.")
    main = ev[0].doc_id if ev else ents[0]
    concl = rng.choice((
        f"Conclusion: {main} is the most relevant choice here.",
        f"Conclusion: use {main} for this task.",
        f"Conclusion: {lower_first(ev[0].sentence) if ev else 'the evidence is limited.'}",
        f"Conclusion: prefer {main}, as the cited documentation shows.",
    ))
    body = ("\n" if style == "bullets" else " ").join(x for x in lines if x)
    return f"{body}\n{concl}"


_SOLVER_THINK = (
    "{t}The question is about {e}. I will search for {q}.{c}",
    "{t}Key terms: {e}. Start with {q}.{c}",
    "{t}I need evidence on {e}.{c}",
    "{t}Search the documentation for {q}.{c}",
)


def _think_first(rng: random.Random, ents: list[str], q: str) -> str:
    e = " and ".join(ents[:2]) if ents else q
    return rng.choice(_SOLVER_THINK).format(t=P.THINK_OPEN, c=P.THINK_CLOSE, e=e, q=q)


def solver_plan(ctx: DemoContext, rng: random.Random, query: str, n_search: int) -> tuple[list[str], list[list[SearchHit]]]:
    """Up to ``n_search`` search strings for ``query`` (at least one) and their retrieved hits."""
    qs = search_queries(rng, query, n_search, ctx.known_ids)
    if not qs:
        qs = [" ".join(query.split()[:4])]
    hits = ctx.retriever.search(qs, ctx.b.topk)
    return qs, hits


def claim_count(ctx: DemoContext, rng: random.Random, short: int) -> int:
    """Findings of one answer: ``short`` for the short answers, else a draw from ``sft.report.claims``."""
    return rng.randint(*ctx.report.claims) if ctx.report else short


def search_count(ctx: DemoContext, rng: random.Random, lo: int, hi: int) -> int:
    """Searches of one report: a draw in ``[lo, hi]`` for the short answers, else from ``sft.report.searches``."""
    return rng.randint(*ctx.report.searches) if ctx.report else rng.randint(lo, hi)


def answer_for(ctx: DemoContext, rng: random.Random, query: str, hits: list[list[SearchHit]], rubric: Rubric | None,
               max_claims: int) -> str:
    """An answer citing the visible evidence of ``hits`` (a research report under ``sft.report``, with
    ``max_claims`` findings); empty when no passage is visible."""
    if ctx.report:
        passages: dict[str, list[str]] = {}
        for hs in hits:
            for doc_id, sentences in visible_passages(ctx.tok, hs, ctx.b.max_observation_tokens):
                passages.setdefault(doc_id, sentences)
        found = list(passages.items())
        if rng.random() < 0.3:
            rng.shuffle(found)
        return build_report(rng, query, found, rubric, ctx.known_ids, max_claims) if found else ""
    ev: list[Evidence] = []
    for hs in hits:
        for e in visible_evidence(ctx.tok, hs, ctx.b.max_observation_tokens):
            if all(e.doc_id != x.doc_id for x in ev):
                ev.append(e)
    if rng.random() < 0.3:
        rng.shuffle(ev)
    if not ev:
        return ""
    return build_answer(rng, query, ev, rubric, ctx.known_ids, max_claims=max_claims)


def solver_prompt(ctx: DemoContext, rng: random.Random, query: str, messages=solver_messages
                  ) -> tuple[HarnessState, Rubric, list[int]] | None:
    """A solver prompt as RL builds one: a random harness state and its rubric (the fallback 40% of the time), in the
    agent's ``messages`` format; ``None`` when it exceeds the prompt budget."""
    state = random_state(rng, ctx.base, ctx.b.evaluator_max_tool_calls)
    rubric = fallback_rubric(state) if rng.random() < 0.4 else random_rubric(rng, state)
    prompt = encode_chat(ctx.tok, messages(query, rubric, state, ctx.b.solver_max_tool_calls))
    return None if len(prompt) > ctx.b.max_prompt_tokens else (state, rubric, prompt)


def solver_group(ctx: DemoContext, rng: random.Random, query: str, n: int) -> list[Demo]:
    """``n`` trajectories for one solver prompt (one harness state and rubric), like RL's K rollouts."""
    built = solver_prompt(ctx, rng, query)
    if built is None:
        return []
    state, rubric, prompt = built
    out = []
    for _ in range(n):
        d = _solver_response(ctx, random.Random(rng.random()), query, state, rubric, prompt)
        if d is not None:
            out.append(d)
    return out


def _solver_response(ctx: DemoContext, rng: random.Random, query: str, state: HarnessState, rubric: Rubric,
                     prompt: list[int]) -> Demo | None:
    """One scripted trajectory; fewer searches and claims on each retry, ``None`` when nothing fits."""
    b = ctx.b
    if ctx.report:
        n_search, n_claims = rng.randint(*ctx.report.searches), rng.randint(*ctx.report.claims)
    else:
        n_search = rng.choices([1, 2, 3, 4], weights=[0.4, 0.38, 0.17, 0.05])[0]
    n_search = min(n_search, max(1, b.solver_max_tool_calls))
    if b.solver_max_tool_calls == 0:
        n_search = 0
    ents = query_entities(query, ctx.known_ids)
    for attempt in range(6):
        n = max(0 if b.solver_max_tool_calls == 0 else 1, n_search - attempt // 2)
        if ctx.report:  # a report that does not fit the budget loses a finding per retry
            max_claims = max(1, n_claims - attempt)
        else:
            max_claims = max(1, 2 - (1 if attempt >= 3 else 0) - (0 if rng.random() < 0.6 else 1))
        sub = random.Random(rng.random())
        qs, hits = solver_plan(ctx, sub, query, n) if n else ([], [])
        answer = answer_for(ctx, sub, query, hits, rubric, max_claims)
        if not answer:
            continue
        turns = []
        for i, q in enumerate(qs):
            if i == 0:
                pre = _think_first(sub, ents, q) if sub.random() < 0.85 else ""
            else:
                pre = f"{P.THINK_OPEN}Next: {q}.{P.THINK_CLOSE}" if sub.random() < 0.5 else ""
            turns.append(f"{pre}{P.SEARCH_OPEN}{q}{P.SEARCH_CLOSE}")
        pre = f"{P.THINK_OPEN}Enough evidence to answer.{P.THINK_CLOSE}" if sub.random() < 0.35 else ""
        turns.append(f"{pre}{P.ANSWER_OPEN}{answer}{P.ANSWER_CLOSE}")
        traj = ctx.script(turns, prompt, b.solver_agent())
        if not traj.finished or traj.truncated or len(traj.response_ids) + 1 > b.solver_max_response_tokens:
            continue
        if traj.search_queries != qs:
            continue
        return Demo(SOLVER, prompt, traj.response_ids + [ctx.eos], traj.response_mask + [1], meta={
            "query": query, "search_queries": list(qs), "retrieved_ids": list(traj.retrieved_ids),
            "answer": answer, "tool_calls": traj.tool_calls, "state": state.to_dict(),
            "rubric": [list(rubric.dims), list(rubric.weights)],
        })
    return None
