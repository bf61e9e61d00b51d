"""Binary evidence items, decided by program (DRB-II's binary rubric items, DeepRubric's evidence leaves).

An evidence item (:class:`~score_lightning.data.items.EvidenceItem`) names the passages that support
one atomic statement (``evidence``) and the key terms a report must state to make it (``terms``). A
report **satisfies** it only when all three hold:

1. **cited**: the report cites one of the item's ``evidence`` ids (a citation as
   :mod:`~score_lightning.rewards.citations` reads it);
2. **retrieved**: that same id is among the ids its own trajectory's searches returned (citing a passage
   it never read does not count, as in a(r) under ``reward.citations=retrieved``);
3. **stated**: every one of the item's ``terms`` appears in the report's prose, case-insensitively
   (citations removed first, so the id inside ``[...]`` never supplies a term): an ASCII term as a whole
   word, with no ASCII letter or digit either side (so ``invariant`` stands in ``不变量invariant的``), a term
   in another script (Chinese has no spaces) as a substring. A term of several words needs each of them.

``item_recall`` is the share of a query's items a report satisfies, and 0 for a report that is not
grounded-valid: a broken or ungrounded report earns no credit for the passages it names. It is the card's
quality metric, ``reward.rule_quality=item_recall``'s q(r) and the order ``scripts/bench_evaluator.py``'s
valid pairs are built on.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence
from typing import Protocol

from score_lightning.rewards.citations import cited_ids, strip_citations



class ItemLike(Protocol):
    """What the verifier reads of an item (the format module's ``EvidenceItem`` has it)."""

    evidence: Sequence[str]
    terms: Sequence[str]


def report_prose(report: str, known_ids: Collection[str] | None = None) -> str:
    """A report's prose, lower-cased, citations removed: what ``terms`` are matched against."""
    return strip_citations(report or "", known_ids=known_ids).lower()


def term_present(term: str, prose: str) -> bool:
    """A term (one word, or several: each must be there) stands in ``prose`` (the rule in the module docstring)."""
    parts = term.lower().split()
    return bool(parts) and all(
        re.search(rf"(?<![a-z0-9_]){re.escape(p)}(?![a-z0-9_])", prose) if p.isascii() else p in prose for p in parts)


def item_check(item: ItemLike, report: str, retrieved: Iterable[str]) -> dict[str, bool]:
    """The three conditions of the module docstring for one item, each by name, and ``satisfied``."""
    seen = set(retrieved)
    cites = set(cited_ids(report or "", known_ids=seen))  # an attached citation of a retrieved id is read
    cited = [e for e in item.evidence if e in cites]
    prose = report_prose(report, seen)
    out = {"cited": bool(cited), "retrieved": any(e in seen for e in cited),
           "stated": all(term_present(t, prose) for t in item.terms)}
    out["satisfied"] = out["cited"] and out["retrieved"] and out["stated"]
    return out


def item_satisfied(item: ItemLike, report: str, retrieved: Iterable[str]) -> bool:
    """Whether ``report`` (with its trajectory's ``retrieved`` ids) satisfies ``item``."""
    return item_check(item, report, retrieved)["satisfied"]


def satisfied_items(items: Sequence[ItemLike], report: str, retrieved: Iterable[str]) -> list[bool]:
    """One verdict per item, in order."""
    seen = tuple(retrieved)
    return [item_satisfied(it, report, seen) for it in items]


def item_recall(items: Sequence[ItemLike], report: str, retrieved: Iterable[str], grounded_valid: bool) -> float | None:
    """Share of ``items`` the report satisfies; 0 when it is not grounded-valid; ``None`` with no items."""
    if not items:
        return None
    if not grounded_valid:
        return 0.0
    verdicts = satisfied_items(items, report, retrieved)
    return sum(verdicts) / len(verdicts)
