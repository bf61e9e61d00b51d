"""The multi-turn search agent loop, batched over every active trajectory.

Turn structure: generate until ``</search>``, the role's finish tag or EOS; run the search; append
``<observation>…</observation>`` (mask 0, truncated to a token budget); repeat up to
``max_tool_calls``; then one final turn that may only finish. Malformed actions get a fixed
"invalid action" observation and are counted, never raised.

Real tokenizers split tags into several BPE pieces, and the piece that completes a tag may carry
more text (``>\n`` ends ``</search>\n``). A turn's action is the tag its last token completed
(:mod:`score_lightning.rollout.stops`), the overhang stays in the turn, and the token ids are kept
exactly as generated. Observations are tokenised on their own and appended, so their mask is exact
even where BPE would have merged text across the boundary.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Protocol, Sequence

from score_lightning import protocol as P
from score_lightning.retrieval.base import RetrievalError, Retriever, hits_or_failed
from score_lightning.rollout.engine import RolloutEngine, SamplingParams, is_collective
from score_lightning.rollout.stops import TagStops, completed_tag
from score_lightning.rollout.trajectory import Trajectory

__all__ = ["Action", "AgentConfig", "TagStops", "format_observation", "parse_search_action", "run_agent", "shown_ids"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentConfig:
    max_tool_calls: int = 10
    max_response_tokens: int = 512
    max_observation_tokens: int = 128
    topk: int = 3
    temperature: float = 1.0
    top_p: float = 1.0
    #: the role's finishing tag: ``</answer>`` for the solver, ``</report_evaluations>`` for scoring
    finish_tag: str = P.ANSWER_CLOSE
    allow_search: bool = True
    #: True: ``max_response_tokens`` bounds the whole response, observations included (the solver, as
    #: verl counts it). False: it bounds the model's own tokens only and observations come on top, each
    #: cut to ``max_observation_tokens`` (scoring: searches must not eat the room to score every report)
    observations_in_budget: bool = True
    #: constrained turns also return the expected value of each score value (``evaluator.score_readout=expected``),
    #: kept in ``Trajectory.value_readouts``
    value_readout: bool = False


class TurnConstraint(Protocol):
    """What a constrained trajectory gives the loop: the grammar of its next turn."""

    def turn_grammar(self, can_search: bool) -> str: ...


@dataclass(frozen=True)
class Action:
    kind: str  # "search" | "finish" | "invalid" | "none"
    query: str = ""
    reason: str = ""


_SEARCH_OPEN_RE = re.compile(re.escape(P.SEARCH_OPEN))


def parse_search_action(segment: str) -> Action:
    """Read the search call at the end of one generated turn (which stopped on ``</search>``).

    Invalid: no opening tag, an empty query, or more than one ``<search>`` before the close
    (two queries in one call).
    """
    end = segment.rfind(P.SEARCH_CLOSE)
    if end < 0:
        return Action("invalid", reason="unclosed search tag")
    head = segment[:end]
    start = head.rfind(P.SEARCH_OPEN)
    if start < 0:
        return Action("invalid", reason="</search> without <search>")
    # A second <search> in the same turn that was never closed means two queries in one call.
    previous_close = head.rfind(P.SEARCH_CLOSE)
    opens = len(_SEARCH_OPEN_RE.findall(head[previous_close + 1 if previous_close >= 0 else 0:]))
    if opens > 1:
        return Action("invalid", reason="two queries in one search call")
    query = head[start + len(P.SEARCH_OPEN):].strip()
    if not query:
        return Action("invalid", reason="empty query")
    if "\n\n" in query or any(tag in query for tag in (P.ANSWER_OPEN, P.OBS_OPEN, P.THINK_OPEN)):
        return Action("invalid", reason="malformed query")
    return Action("search", query=query)


def format_observation(hits, budget_tokens: int, tokenizer) -> tuple[list[int], list[str]]:
    """Token ids of ``<observation>…</observation>`` with the passage text cut to ``budget_tokens``, and
    the ids of the hits the model was shown.

    The tags and the body are tokenised separately and concatenated, so the mask boundary is exact.
    "Retrieved" means shown: a hit whose ``[id]`` line head was cut off by the budget is not among the
    returned ids, so citing it counts as citing an id the trajectory never retrieved.
    """
    body = "\n".join(f"[{h.id}] {h.text}" for h in hits) if hits else "No results."
    body_ids = _body_ids(body, budget_tokens, tokenizer)
    return _wrap_ids(body_ids, tokenizer), shown_ids(hits, tokenizer.decode(body_ids))


def shown_ids(hits, shown_text: str) -> list[str]:
    """The hits whose ``[id]`` appears in the text the model was shown (an observation cut to its budget)."""
    return [h.id for h in hits if f"[{h.id}]" in shown_text]


def _body_ids(body: str, budget_tokens: int, tokenizer) -> list[int]:
    return tokenizer(body, add_special_tokens=False)["input_ids"][: max(budget_tokens, 1)]


def _wrap_ids(body_ids: list[int], tokenizer) -> list[int]:
    enc = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    return enc("\n") + enc(P.OBS_OPEN) + body_ids + enc(P.OBS_CLOSE) + enc("\n")


def _wrap_observation(body: str, budget_tokens: int, tokenizer) -> list[int]:
    return _wrap_ids(_body_ids(body, budget_tokens, tokenizer), tokenizer)


def run_agent(
    engine: RolloutEngine,
    tokenizer,
    prompts: Sequence[Sequence[int]],
    retriever: Retriever | None,
    cfg: AgentConfig,
    metas: Sequence[dict] | None = None,
    constraints: Sequence[TurnConstraint | None] | None = None,
) -> list[Trajectory]:
    """Roll out every prompt to completion; returns one :class:`Trajectory` per prompt, in order.

    ``constraints`` (one per prompt, ``None``: free) give each turn a grammar its text must
    match, depending on whether a search is still allowed (:mod:`~score_lightning.rollout.constrained`).
    """
    trajs = [Trajectory(prompt_ids=list(p), meta=dict(metas[i]) if metas else {}) for i, p in enumerate(prompts)]
    search_stops = TagStops(tokenizer, [P.SEARCH_CLOSE, cfg.finish_tag])
    final_stops = TagStops(tokenizer, [cfg.finish_tag])
    active = list(range(len(trajs)))
    lockstep = is_collective(engine)
    while _any_active(active, lockstep):
        # Group by whether search is still allowed: the stop set differs.
        can_search = [i for i in active if cfg.allow_search and trajs[i].tool_calls < cfg.max_tool_calls]
        final = [i for i in active if i not in set(can_search)]
        pending: list[tuple[int, str]] = []
        for group, stops in ((can_search, search_stops), (final, final_stops)):
            if not group:
                if lockstep:  # a collective engine: join the other ranks' call with no prompts
                    engine.generate([], SamplingParams(max_new_tokens=1, stop_token_ids=stops.token_ids))
                continue
            budget = max(_room(trajs[i], cfg) for i in group)
            grammars = ()
            if constraints is not None and any(c is not None for c in constraints):
                searching = stops is search_stops
                grammars = tuple(None if constraints[i] is None else constraints[i].turn_grammar(searching) for i in group)
            params = SamplingParams(
                max_new_tokens=budget, temperature=cfg.temperature, top_p=cfg.top_p,
                stop_token_ids=stops.token_ids, stop_strings=stops.strings, grammars=grammars,
                value_readout=cfg.value_readout and any(g is not None for g in grammars),
            )
            gens = engine.generate([trajs[i].prompt_ids + trajs[i].response_ids for i in group], params)
            for i, gen in zip(group, gens):
                t = trajs[i]
                room = _room(t, cfg)
                ids = gen.token_ids[:room]
                lps = gen.logprobs[:room] if gen.logprobs is not None else None
                t.value_readouts.extend((len(t.response_ids) + k, v) for k, v in gen.extra.get("value_readouts", ())
                                        if k < len(ids))
                t.append(ids, 1, lps)
                ended = None if len(ids) < len(gen.token_ids) else _turn_end(ids, tokenizer, stops)
                if ended is None:  # cut by the budget, or stopped for no reason we know: treat as cut
                    t.truncated = True
                    continue
                segment = tokenizer.decode(ids)
                if ended != P.SEARCH_CLOSE:  # the finish tag or an end-of-turn token
                    if segment.rstrip().endswith(P.SEARCH_OPEN) or _unclosed_search(segment):
                        # the turn ended inside an open search call: a malformed action, answer it and go on
                        pending.append((i, ""))
                        t.invalid_actions += 1
                        t.tool_calls += 1
                        continue
                    t.finished = True
                    continue
                action = parse_search_action(segment)
                t.tool_calls += 1
                if action.kind == "search":
                    pending.append((i, action.query))
                    t.search_queries.append(action.query)
                else:
                    t.invalid_actions += 1
                    pending.append((i, ""))
        _answer_searches(pending, trajs, retriever, cfg, tokenizer)
        active = [i for i in active if not trajs[i].finished and not trajs[i].truncated]
    return trajs


def _room(t: Trajectory, cfg: AgentConfig) -> int:
    """Tokens the model may still write: the budget minus what counts against it (see ``observations_in_budget``)."""
    return cfg.max_response_tokens - (len(t.response_ids) if cfg.observations_in_budget else t.num_model_tokens)


def _any_active(active: list[int], lockstep: bool) -> bool:
    """Whether to run another turn; with a collective engine, while *any* rank has work left."""
    if not lockstep:
        return bool(active)
    from score_lightning import distributed as D

    return D.global_max(len(active)) > 0


def _turn_end(ids: list[int], tokenizer, stops: TagStops) -> str | None:
    """How a generated turn ended: one of the stop tags, ``"eos"`` (an end-of-turn id), or ``None``.

    A tag is recognised when the turn's last token completed it, even if that token carries more
    text (``</search>\n``): see :func:`~score_lightning.rollout.stops.completed_tag`. The ids stay
    exactly as generated; the overhang is simply part of the turn.
    """
    if not ids:
        return None
    if ids[-1] in stops.end_ids:
        return "eos"
    found = completed_tag(ids, tokenizer.decode, stops.tags)
    return found[0] if found is not None else None


def _unclosed_search(segment: str) -> bool:
    return segment.rfind(P.SEARCH_OPEN) > segment.rfind(P.SEARCH_CLOSE)


def _answer_searches(pending, trajs, retriever, cfg: AgentConfig, tokenizer) -> None:
    """Run all pending queries in one retriever call and append the observations."""
    queries = [(i, q) for i, q in pending if q]
    results: dict[int, list | None] = {}
    if queries and retriever is not None:
        try:
            hits = retriever.search([q for _, q in queries], cfg.topk)
        except RetrievalError as exc:  # the queries that did get hits keep them; only the failed ones count
            hits = hits_or_failed(exc, len(queries))
            log.warning("retrieval failed for %d of %d queries: %s", hits.count(None), len(queries), exc)
        results = {i: h for (i, _), h in zip(queries, hits)}
    for i, q in pending:
        t = trajs[i]
        if not q:
            ids = _wrap_observation(P.invalid_action_observation(cfg.finish_tag), cfg.max_observation_tokens, tokenizer)
        elif results.get(i) is None:
            t.retrieval_errors += 1
            ids = _wrap_observation(P.RETRIEVAL_FAILED_OBSERVATION, cfg.max_observation_tokens, tokenizer)
        else:
            ids, doc_ids = format_observation(results.get(i, []), cfg.max_observation_tokens, tokenizer)
            t.retrieved_ids.extend(d for d in doc_ids if d not in t.retrieved_ids)
        if t.tool_calls >= cfg.max_tool_calls:
            ids = ids + _wrap_observation(P.tool_budget_observation(cfg.finish_tag), 64, tokenizer)
        if not cfg.observations_in_budget:
            t.append(ids, 0)
            continue
        room = cfg.max_response_tokens - len(t.response_ids)
        t.append(ids[:room], 0)
        if len(t.response_ids) >= cfg.max_response_tokens:
            t.truncated = True
