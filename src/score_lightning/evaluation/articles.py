"""From a solver trajectory to a benchmark article and its sources record.

**Article rule.** The article is the content of the last ``<answer>…</answer>`` block of the
model-written text (observations excluded), even when :func:`~score_lightning.roles.answer.parse_answer`
finds it invalid for another reason (too short, no citation, ...). Without a closed block (the model
never answered, or ran out of tokens) it is the model's *final turn*: the text written after the last
``<observation>``, with ``<think>…</think>`` blocks and search calls removed. In both cases leftover
protocol tags and chat markers are stripped. ``valid_answer``/``invalid_reason`` in the sources file
say which case applied.

**Validity fields** of the sources record (:func:`answer_checks`), all with the run's
``reward.min_answer_chars``: ``valid_answer`` is the format rule (a closed, untruncated, well-formed
``<answer>`` that is long enough; no citation needed), ``grounded_valid`` the reward's grounded a(r) (that,
plus at least one citation, every cited id retrieved by the trajectory's own searches), and
``reward_valid`` a(r) under the run's own ``reward.citations`` / ``reward.require_citation``.

The sources record keeps, per article, the ``[doc_id]`` citations with the text of each cited
passage as it was retrieved (:class:`RecordingRetriever`), so citations can be judged later without
the retriever.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from score_lightning import protocol as P
from score_lightning.data.queries import Query
from score_lightning.retrieval.base import SearchHit
from score_lightning.rewards.citations import cited_ids, cites_only_retrieved, ungrounded_ids
from score_lightning.roles.answer import AnswerParse, parse_answer
from score_lightning.rollout.trajectory import Trajectory

_THINK_RE = re.compile(re.escape(P.THINK_OPEN) + r".*?" + re.escape(P.THINK_CLOSE), re.DOTALL)
_SEARCH_RE = re.compile(re.escape(P.SEARCH_OPEN) + r".*?" + re.escape(P.SEARCH_CLOSE), re.DOTALL)
_LEFTOVER_TAGS = tuple(P.PROTOCOL_TOKENS) + tuple(P.SPECIAL_TOKENS)


def clean_text(text: str) -> str:
    """Remove think blocks, search calls, leftover protocol tags and chat markers."""
    text = _THINK_RE.sub("", text)
    text = _SEARCH_RE.sub("", text)
    for tag in _LEFTOVER_TAGS:
        text = text.replace(tag, "")
    return text.strip()


def final_turn_text(traj: Trajectory, tokenizer) -> str:
    """The model-written tokens after the last observation, decoded."""
    end = len(traj.response_ids)
    start = end
    while start > 0 and traj.response_mask[start - 1] == 1:
        start -= 1
    return tokenizer.decode(traj.response_ids[start:end])


def article_from_trajectory(traj: Trajectory, tokenizer) -> tuple[str, AnswerParse]:
    """The article (module docstring rule) and the answer parse it came from."""
    parsed = parse_answer(traj.model_text(tokenizer), traj.truncated)
    if parsed.answer is not None:
        article = clean_text(parsed.answer)
        if article:
            return article, parsed
    return clean_text(final_turn_text(traj, tokenizer)), parsed


@dataclass(frozen=True)
class AnswerRule:
    """The reward's a(r) settings (``reward.citations``, ``reward.require_citation``, ``reward.min_answer_chars``)."""

    citations: str = "any"
    require_citation: bool = False
    min_answer_chars: int = 20


def answer_checks(traj: Trajectory, tokenizer, rule: AnswerRule) -> dict[str, Any]:
    """The validity fields of one trajectory (module docstring), judged on model-written tokens as the reward is."""
    text = traj.model_text(tokenizer)
    fmt = parse_answer(text, traj.truncated, min_chars=rule.min_answer_chars)
    grounded = parse_answer(text, traj.truncated, require_citation=True, min_chars=rule.min_answer_chars,
                            retrieved=traj.retrieved_ids, require_grounded=True)
    reward = parse_answer(text, traj.truncated, require_citation=rule.require_citation,
                          min_chars=rule.min_answer_chars, retrieved=traj.retrieved_ids,
                          require_grounded=rule.citations == "retrieved")
    return {"valid_answer": fmt.valid, "invalid_reason": fmt.reason, "grounded_valid": grounded.valid,
            "grounded_reason": grounded.reason, "reward_valid": reward.valid}


class RecordingRetriever:
    """Wraps a retriever and remembers every passage it returned (id -> hit), for the sources file."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.passages: dict[str, SearchHit] = {}

    def search(self, queries: list[str], topk: int) -> list[list[SearchHit]]:
        hits = self.inner.search(queries, topk)
        for row in hits:
            for h in row:
                self.passages[h.id] = h
        return hits


def sources_record(query: Query, traj: Trajectory, article: str, parsed: AnswerParse,
                   passages: dict[str, SearchHit], sample: int = 0, checks: dict[str, Any] | None = None,
                   ) -> dict[str, Any]:
    """The sources line of one sampled article: the article, its citations with their retrieved text, search
    and validity stats. ``checks`` (:func:`answer_checks`) gives the validity fields; without it only the
    format rule of ``parsed`` is recorded."""
    cites = cited_ids(article, known_ids=set(traj.retrieved_ids))
    never = set(ungrounded_ids(cites, traj.retrieved_ids))
    citations = []
    for doc_id in cites:
        hit = passages.get(doc_id) if doc_id not in never else None
        citations.append({
            "doc_id": doc_id,
            "retrieved": doc_id not in never,
            "title": hit.title if hit is not None else None,
            "text": hit.text if hit is not None else None,
        })
    if checks is None:
        checks = {"valid_answer": bool(parsed.valid), "invalid_reason": parsed.reason}
    rec: dict[str, Any] = {
        "id": query.extra.get("id", query.id),  # data, not config
        "sample": int(sample),
        "article": article,
        "citations": citations,
        "retrieved_ids": list(traj.retrieved_ids),
        "cites_only_retrieved": cites_only_retrieved(cites, traj.retrieved_ids),
        "search_queries": list(traj.search_queries),
        **checks,
        "tool_calls": traj.tool_calls,
        "invalid_actions": traj.invalid_actions,
        "retrieval_errors": traj.retrieval_errors,
        "truncated": traj.truncated,
        "response_tokens": len(traj.response_ids),
    }
    for key, value in query.extra.items():  # other query fields; ours win, theirs get a prefix
        if key == "id":
            continue
        rec[key if key not in rec else f"query_{key}"] = value
    return rec
