"""Natural-language rubric items (RLER): the evaluator's item-writing prompts and a forgiving parser.

The evaluator writes::

    <rubric_items><item weight="0.4">The report explains X with a cited source.</item>
    <item weight="0.2" sign="-">Claims a function exists that the corpus does not show.</item></rubric_items>

A ``sign="-"`` item is a "penalise this" criterion: it subtracts its weighted score. Items become a
:class:`~score_lightning.roles.rubric.Rubric` with short ids (``i1``, ``i2``, ...) the scorer uses.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from score_lightning.roles.rubric import ATTR_PATTERN, Rubric, parse_attributes, parse_number

ITEMS_OPEN, ITEMS_CLOSE = "<rubric_items>", "</rubric_items>"
_ITEM_RE = re.compile(rf"<item((?:\s+{ATTR_PATTERN})*)\s*>(.*?)</item>", re.DOTALL)
MAX_ITEM_CHARS = 300

ITEMS_SYSTEM = (
    "You are the evaluator. Write rubric items that will judge deep-research reports on the question: "
    "specific, checkable criteria, each one sentence. Output exactly one block:\n"
    f'{ITEMS_OPEN}<item weight="0.40">criterion</item><item weight="0.20" sign="-">a flaw to penalise</item>'
    f"{ITEMS_CLOSE}\nWeights are positive numbers; sign=\"-\" marks a flaw."
)


@dataclass(frozen=True)
class Item:
    text: str
    weight: float  # > 0
    negative: bool = False


@dataclass(frozen=True)
class ItemsParse:
    items: tuple[Item, ...]
    error: str  # "" when at least one item parsed


def parse_items(text: str) -> ItemsParse:
    """Items of the first complete ``<rubric_items>`` block; malformed items are skipped. Never raises."""
    if not isinstance(text, str):
        return ItemsParse((), "not text")
    close = text.find(ITEMS_CLOSE)
    if close < 0:
        return ItemsParse((), f"missing {ITEMS_CLOSE}")
    start = text.rfind(ITEMS_OPEN, 0, close)
    if start < 0:
        return ItemsParse((), f"missing {ITEMS_OPEN}")
    items = []
    for m in _ITEM_RE.finditer(text[start:close]):
        attrs = parse_attributes(m.group(1))
        body = " ".join(m.group(2).split())[:MAX_ITEM_CHARS]
        weight = parse_number(attrs.get("weight", ""))  # data, not config
        if not body or weight is None or weight <= 0:
            continue
        items.append(Item(body, weight, attrs.get("sign", "+").strip() == "-"))
    return ItemsParse(tuple(items), "" if items else "no valid <item>")


def checked_items(text: str) -> str:
    """An external writer's reply must hold at least one item (else it is re-asked)."""
    parsed = parse_items(text)
    if not parsed.items:
        raise ValueError(parsed.error)
    return text


def items_rubric(items: Sequence[Item]) -> Rubric:
    """The items as a scoring rubric: ids ``i1..``, weights normalised by the positive total, flaws negative."""
    positive = sum(it.weight for it in items if not it.negative) or 1.0
    return Rubric(tuple(f"i{j}" for j in range(1, len(items) + 1)),
                  tuple((-it.weight if it.negative else it.weight) / positive for it in items),
                  tuple(it.text for it in items))


def init_messages(query: str, passages: Sequence[str], n_items: int) -> list[dict]:
    """Search-grounded initialisation: the question and what the corpus returns for it."""
    found = "\n".join(f"- {p}" for p in passages) or "- (nothing found)"
    user = (f"Question: {query.strip()}\n\nWhat a search of the corpus returns:\n{found}\n\n"
            f"Write {n_items} rubric items for reports answering this question.")
    return [{"role": "system", "content": ITEMS_SYSTEM}, {"role": "user", "content": user}]


def contrast_messages(query: str, current: Sequence[Item], best: str, worst: str, n_items: int,
                      best_passages: str = "", worst_passages: str = "") -> list[dict]:
    """Evolution: new items that separate the best report from the worst under the current rubric, each report shown
    with the passages its searches returned (RLER grounds new items in the rollouts' evidence, not their text alone)."""
    listed = "\n".join(f"- {'(flaw) ' if it.negative else ''}{it.text}" for it in current) or "- (none)"

    def shown(title: str, report: str, passages: str) -> str:
        found = f"\n\n[Passages its searches returned]\n{passages.strip()}" if passages.strip() else ""
        return f"[{title}]\n{report.strip()}{found}"

    user = (f"Question: {query.strip()}\n\nCurrent rubric items:\n{listed}\n\n{shown('Best report', best, best_passages)}"
            f"\n\n{shown('Worst report', worst, worst_passages)}\n\nWrite {n_items} new rubric items, not already "
            "listed, that tell these two reports apart (what the best does right, or what the worst does wrong).")
    return [{"role": "system", "content": ITEMS_SYSTEM}, {"role": "user", "content": user}]
