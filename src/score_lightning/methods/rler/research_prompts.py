"""DR-rubric's two writer prompts: research the question by searching (Stage I), then distil the findings into atomic
rubric items (Stage II), and the pure helpers that read and reshape what the writer returns.

Stage I ends in ``<findings>…</findings>``: the domain facts, the structure a good answer needs and the failure modes
the writer's searches turned up. Stage II answers in the RLER item format (:mod:`score_lightning.methods.rler.items`), so
the items score exactly as RLER's do.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from score_lightning import protocol as P
from score_lightning.methods.rler.items import ITEMS_CLOSE, ITEMS_OPEN, Item

FINDINGS_OPEN, FINDINGS_CLOSE = "<findings>", "</findings>"

RESEARCH_SYSTEM = (
    "You are the rubric researcher. Before anyone writes rubric items for reports on the question, find out what a "
    f"correct and insightful answer needs. Search the corpus with {P.SEARCH_OPEN}query{P.SEARCH_CLOSE}; results come "
    f"back in {P.OBS_OPEN}…{P.OBS_CLOSE}. When you know enough, write your notes once:\n"
    f"{FINDINGS_OPEN}facts a report must get right, with [ids]; the structure it needs; the mistakes to watch for"
    f"{FINDINGS_CLOSE}"
)

DISTIL_SYSTEM = (
    "You are the rubric distiller. Turn research notes into atomic rubric items: each item checks one thing, can be "
    "verified on its own from the report and the cited passages, and is one sentence. Output exactly one block:\n"
    f'{ITEMS_OPEN}<item weight="0.40">criterion</item><item weight="0.20" sign="-">a flaw to penalise</item>'
    f"{ITEMS_CLOSE}\nWeights are positive numbers; sign=\"-\" marks a flaw."
)

_OBS_RE = re.compile(re.escape(P.OBS_OPEN) + r"(.*?)" + re.escape(P.OBS_CLOSE), re.DOTALL)
_PASSAGE_RE = re.compile(r"^\[([^\]\s]+)\] (.*)$", re.MULTILINE)


def research_messages(query: str) -> list[dict]:
    """Stage I: the question alone; what the answer needs is for the writer's own searches to find."""
    user = f"Question: {query.strip()}\n\nResearch what a good report on this question must contain."
    return [{"role": "system", "content": RESEARCH_SYSTEM}, {"role": "user", "content": user}]


def distil_messages(query: str, findings: str, passages: str, n_items: int) -> list[dict]:
    """Stage II: the question, the Stage I notes and the passages its searches returned."""
    notes = findings.strip() or "(no notes were written)"
    found = passages.strip() or "(nothing found)"
    user = (f"Question: {query.strip()}\n\nResearch notes:\n{notes}\n\nPassages the research returned:\n{found}\n\n"
            f"Write {n_items} atomic rubric items for reports answering this question.")
    return [{"role": "system", "content": DISTIL_SYSTEM}, {"role": "user", "content": user}]


def findings_text(text: str) -> str:
    """The notes of the last complete ``<findings>`` block, or "" (Stage II then distils from the passages alone)."""
    close = text.rfind(FINDINGS_CLOSE)
    start = text.rfind(FINDINGS_OPEN, 0, close) if close >= 0 else -1
    return " ".join(text[start + len(FINDINGS_OPEN):close].split()) if start >= 0 else ""


def observed_passages(text: str, max_passages: int, max_chars: int) -> str:
    """``[id] text`` lines of every passage the research's observations showed, first sighting first, each cut."""
    seen: dict[str, str] = {}
    for body in _OBS_RE.findall(text):
        for doc, passage in _PASSAGE_RE.findall(body):
            seen.setdefault(doc, " ".join(passage.split()))
    return "\n".join(f"[{d}] {t[:max_chars]}" for d, t in list(seen.items())[:max_passages])


def atomic_items(items: Sequence[Item], max_items: int) -> list[Item]:
    """Stage II's output made atomic: an item joining checks with ";" becomes one item per check, each with an equal
    share of its weight (a part under two words stays with its neighbours); items with the same text (case and
    spacing aside) and sign merge, weights added, at the first one's place; the ``max_items`` heaviest stay, in order.
    """
    parts: list[Item] = []
    for it in items:
        pieces = [" ".join(p.split()).strip(" .") for p in it.text.split(";")]
        pieces = [p for p in pieces if len(p.split()) >= 2] if len(pieces) > 1 else [it.text]
        pieces = pieces or [it.text]
        parts.extend(Item(p, it.weight / len(pieces), it.negative) for p in pieces)
    merged: dict[tuple[str, bool], Item] = {}
    for it in parts:
        key = (" ".join(it.text.lower().split()).strip(" ."), it.negative)
        old = merged.get(key)
        merged[key] = it if old is None else Item(old.text, old.weight + it.weight, old.negative)
    ordered = list(merged.values())
    keep = sorted(range(len(ordered)), key=lambda j: (-ordered[j].weight, j))[:max(max_items, 1)]
    return [ordered[j] for j in sorted(keep)]
