"""What a rubric source observes after the scoring: each query's judged reports only.

A report no complete evaluation scored (an external judge's failed judgement, an evaluation cut before it) has a
row of zeros in its query's item scores. Read as scores, those zeros would widen RLER's item spreads (an item no
judged report separates is kept) and make the unjudged report the query's "worst" contrast example. So the rubric
source sees, per query, the judged reports' score rows, texts, rewards and passages, in their order, and nothing
of the others (pure functions, tested against hand computations).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def keep(values: Sequence[T], judged: Sequence[bool]) -> list[T]:
    """The judged entries of one query's ``values``, in order."""
    return [v for v, j in zip(values, judged) if j]


def judged_groups(judged: Sequence[bool], num_reports: int) -> list[list[bool]]:
    """Per query: which of its reports were judged (``judged`` is query-major, ``num_reports`` per query)."""
    return [list(judged[i:i + num_reports]) for i in range(0, len(judged), num_reports)]


def judged_view(judged: Sequence[bool], num_reports: int, item_scores: Sequence[Any],
                reports: Sequence[Sequence[str | None]], rewards: Sequence[Sequence[float]],
                passages: Callable[[], list[list[dict[str, str]]]] | None = None,
                ) -> tuple[list[Any], list[list[str | None]], list[list[float]],
                           Callable[[], list[list[dict[str, str]]]] | None]:
    """``observe``'s inputs restricted to the judged reports: per query the rows of its ``[K, k]`` item scores
    (``None`` stays ``None``), its report texts, its rewards, and lazily the passages its reports' searches showed."""
    groups = judged_groups(judged, num_reports)
    scores = [None if s is None else s[[bool(j) for j in g]] for s, g in zip(item_scores, groups)]
    texts = [keep(r, g) for r, g in zip(reports, groups)]
    kept_rewards = [keep(r, g) for r, g in zip(rewards, groups)]
    shown = None if passages is None else (lambda: [keep(p, g) for p, g in zip(passages(), groups)])
    return scores, texts, kept_rewards, shown
