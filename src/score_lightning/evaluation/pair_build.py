"""The pairs ``scripts/bench_evaluator.py`` asks an evaluator to order (pure functions, no model).

From sampled reports of held-out queries (each with the ids its own searches returned), two kinds of pair,
each with a known better side:

* **degraded**: a grounded-valid report against one of its own minimal edits
  (:mod:`score_lightning.rewards.report_edits`): ``no_citation`` (every citation dropped),
  ``unretrieved_citation`` (its first citation swapped for a real corpus id its searches never returned),
  ``truncated`` (conclusion dropped, the rest cut to its first half), ``off_topic`` (a grounded-valid report
  of another held-out query, with that report's own retrieved ids) and ``empty`` (no report). The original
  is the better side. An edit is kept only when the verifier agrees it is worse: its grounded validity and
  ``item_recall`` are at most the original's, the two citation edits are not grounded-valid, and the cut
  report has fewer words; otherwise it is skipped and counted.
* **valid**: two grounded-valid reports of the same query whose ``item_recall``
  (:mod:`score_lightning.rewards.items`) differs by at least one satisfied item; the better side satisfies more.

Grounded validity is the card's and the reward's a(r) under ``reward.citations=retrieved``: a closed,
well-formed answer of at least ``min_chars`` non-space characters that cites at least one id, every cited id
retrieved by its own trajectory. Which side of a pair comes first is drawn (``rng``), so a joint evaluation
of the two sees the better one first in about half the pairs. The pair's types (:class:`Pair`, :class:`Side`,
``EDIT_KINDS``) live in :mod:`score_lightning.rewards.report_pairs`, which the preference method shares.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from score_lightning.rewards.citations import cited_ids
from score_lightning.rewards.items import ItemLike, satisfied_items
from score_lightning.rewards.report_edits import cut_short, drop_citations, replace_citation, unretrieved_id
from score_lightning.rewards.report_pairs import EDIT_KINDS, ORIGINAL, VALID, Pair, Side
from score_lightning.roles.answer import parse_answer


@dataclass(frozen=True)
class Sample:
    """One sampled report of a query: the answer text (``None``: no closed answer) and its trajectory's
    retrieved ids; ``grounded_valid`` as the trajectory's own parse read it (a cut trajectory is not)."""

    query_id: str
    query: str
    text: str | None
    retrieved: tuple[str, ...]
    grounded_valid: bool
    index: int = 0  # which rollout of the query


def grounded_answer_valid(text: str | None, retrieved: Iterable[str], min_chars: int) -> bool:
    """a(r) with ``reward.citations=retrieved`` for an answer text (what ``parse_answer`` reads inside
    ``<answer>``), for edits, which have no trajectory of their own."""
    if not text:
        return False
    return parse_answer(f"<answer>{text}</answer>", False, require_citation=True, min_chars=min_chars,
                        retrieved=tuple(retrieved), require_grounded=True).valid


def judge_side(text: str | None, retrieved: Sequence[str], grounded: bool, items: Sequence[ItemLike],
               edit: str = ORIGINAL, source_query: str = "", sample: int = -1) -> Side:
    """The verifier's view of a report against the pair's query's ``items``."""
    sat = sum(satisfied_items(items, text or "", retrieved)) if (items and grounded and text) else 0
    recall = (sat / len(items)) if items else None
    return Side(text, tuple(retrieved), bool(grounded), recall, sat, len((text or "").split()), edit, source_query,
                sample)


def _degraded_enough(base: Side, edit: Side, kind: str) -> bool:
    if edit.grounded_valid > base.grounded_valid or (edit.item_recall or 0.0) > (base.item_recall or 0.0):
        return False
    if kind in ("no_citation", "unretrieved_citation"):
        return not edit.grounded_valid
    if kind == "truncated":
        return edit.words < base.words
    return True


def _edit(kind: str, base: Side, query_id: str, items: Sequence[ItemLike], rng: random.Random,
          known_ids: frozenset[str], others: Sequence[Side], min_chars: int) -> Side | None:
    """One edit of ``base`` (None: this kind cannot be made of it)."""
    text = base.text or ""
    if kind == "empty":
        return judge_side(None, base.retrieved, False, items, kind, query_id, base.sample)
    if kind == "off_topic":
        if not others:
            return None
        o = rng.choice(list(others))
        return judge_side(o.text, o.retrieved, grounded_answer_valid(o.text, o.retrieved, min_chars), items, kind,
                          o.source_query, o.sample)
    if kind == "no_citation":  # citations read as the reward reads them: with the report's retrieved ids
        new = drop_citations(text, base.retrieved)
    elif kind == "unretrieved_citation":
        cites = cited_ids(text, base.retrieved)
        pool = known_ids or frozenset(r for o in others for r in o.retrieved)
        if not cites or not (set(pool) - set(base.retrieved)):
            return None
        new = replace_citation(text, cites[0], unretrieved_id(rng, pool, base.retrieved), base.retrieved)
    elif kind == "truncated":
        new = cut_short(text)
    else:
        raise ValueError(f"unknown edit kind {kind!r}: allowed {EDIT_KINDS}")
    if new == text:
        return None
    return judge_side(new, base.retrieved, grounded_answer_valid(new, base.retrieved, min_chars), items, kind,
                      query_id, base.sample)


def _ordered(pair_sides: tuple[Side, Side], rng: random.Random) -> tuple[tuple[Side, Side], int]:
    """(better, worse) in a drawn order, and where the better side landed."""
    better = rng.randrange(2)
    return (pair_sides if better == 0 else (pair_sides[1], pair_sides[0])), better


def _round_robin(per_query: Mapping[str, list], rng: random.Random) -> list:
    """Entries of every query, one query at a time in a drawn order, so a cap spreads over queries."""
    order = sorted(per_query)
    rng.shuffle(order)
    lists = {q: list(per_query[q]) for q in order}
    for q in order:
        rng.shuffle(lists[q])
    out = []
    while any(lists.values()):
        for q in order:
            if lists[q]:
                out.append(lists[q].pop(0))
    return out


@dataclass
class BuildStats:
    """What the builder found and left out (printed and stored in the manifest)."""

    samples: int = 0
    grounded_valid: int = 0
    distinct_valid: int = 0
    skipped: dict[str, int] | None = None  # per edit kind: edits not made or not degraded


def build_pairs(samples: Sequence[Sample], items: Mapping[str, Sequence[ItemLike]], rng: random.Random, *,
                max_degraded: int, max_valid: int, known_ids: Iterable[str] = (), min_chars: int = 20,
                kinds: Sequence[str] = EDIT_KINDS) -> tuple[list[Pair], BuildStats]:
    """The degraded pairs (at most ``max_degraded``: whole originals with all their edits, taken one query at a
    time until the cap) and the valid pairs (at most ``max_valid``), deterministic for an ``rng`` state."""
    known = frozenset(known_ids)
    stats = BuildStats(samples=len(samples), skipped={k: 0 for k in kinds})
    queries: dict[str, str] = {}
    originals: dict[str, list[Side]] = {}
    for s in samples:
        queries.setdefault(s.query_id, s.query)
        side = judge_side(s.text, s.retrieved, s.grounded_valid and bool(s.text), items.get(s.query_id, ()),
                          ORIGINAL, s.query_id, s.index)
        stats.grounded_valid += int(side.grounded_valid)
        seen = originals.setdefault(s.query_id, [])
        if side.grounded_valid and all((o.text, o.retrieved) != (side.text, side.retrieved) for o in seen):
            seen.append(side)
    stats.distinct_valid = sum(len(v) for v in originals.values())
    degraded: list[Pair] = []
    for base in _round_robin({q: v for q, v in originals.items() if v}, rng):
        if len(degraded) >= max_degraded:
            break
        qid = base.source_query
        q_items = items.get(qid, ())
        others = [o for q, v in sorted(originals.items()) if q != qid for o in v]
        for kind in kinds:
            edit = _edit(kind, base, qid, q_items, rng, known, others, min_chars)
            if edit is None or not _degraded_enough(base, edit, kind):
                stats.skipped[kind] += 1
                continue
            sides, better = _ordered((base, edit), rng)
            degraded.append(Pair(qid, queries[qid], kind, sides, better))
    degraded = degraded[:max_degraded]
    candidates: dict[str, list[tuple[Side, Side]]] = {}
    for qid, sides in sorted(originals.items()):
        for i in range(len(sides)):
            for j in range(i + 1, len(sides)):
                a, b = sides[i], sides[j]
                if a.item_recall is not None and a.satisfied != b.satisfied:
                    candidates.setdefault(qid, []).append((a, b) if a.satisfied > b.satisfied else (b, a))
    valid = []
    for better_side, worse_side in _round_robin(candidates, rng)[:max_valid]:
        qid = better_side.source_query
        sides, better = _ordered((better_side, worse_side), rng)
        valid.append(Pair(qid, queries[qid], VALID, sides, better))
    return degraded + valid, stats
