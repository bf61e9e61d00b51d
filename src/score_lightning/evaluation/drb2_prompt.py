"""The DeepResearch Bench II judge request for one batch of rubric items, and its reply parser.

The request has the shape of DRB-II's ``run_evaluation.py``: one user message with the scoring
rules, the report as ``<passage>`` and the batch as ``<task_and_rubric>``, a JSON object
``{"task", "rubric_items", "blocked"}``. The judge gives every item a three-way score:

* ``1``: the report satisfies the item, and its supporting sentences do not cite the blocked source;
* ``0``: the report does not mention the item;
* ``-1``: the report mentions it, but its supporting sentences cite the blocked source.

and answers ``{"results": [{"rubric_item", "score", "reason", "evidence"}, ...]}``. The wording of
the rules is this project's, not a copy of DRB-II's prompt.

Parsing is tolerant of form (code fences, prose or ``<think>`` around the JSON, a bare list, score
``"1"``/``1.0``, an item echoed with other whitespace, case, quote marks or final punctuation) but not
of content: a reply must score every item of its batch with 1, 0 or -1, or it is a
:class:`~score_lightning.clients.chat.ReplyError` and the judge is asked again.
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

from score_lightning.data.drb2_tasks import Drb2Task
from score_lightning.clients.chat import ReplyError

SCORES: tuple[int, ...] = (1, 0, -1)

INSTRUCTIONS = (
    "You are given a research report (the passage), the research task it was written for, and a list "
    "of rubric items. Check the report against each rubric item and give every item one of three "
    "scores:\n"
    "- 1: the report clearly satisfies the item, and the sentence(s) supporting it do not cite the "
    'reference listed under "blocked" (match it by title or URL). An item with numbers is satisfied '
    "only when the report states the exact values the item gives.\n"
    "- 0: the report does not mention what the item asks for.\n"
    "- -1: the report mentions it, but the supporting sentence(s) cite the blocked reference.\n"
    'For every item give "score" (1, 0 or -1), "reason" (a short explanation) and "evidence" (the '
    "supporting sentence(s) quoted from the report; an empty string when the score is 0).\n\n"
    "<task_and_rubric> holds a JSON object: "
    '{"task": "...", "rubric_items": ["...", ...], "blocked": {"title": "...", "authors": [...], "urls": [...]}}.\n\n'
    "Reply with one JSON object and nothing else:\n"
    '{"results": [{"rubric_item": "<the item>", "score": 1, "reason": "...", "evidence": "..."}, ...]}\n'
    'Give one entry for EVERY rubric item, and copy each "rubric_item" exactly, character for '
    "character, from the input."
)


def batch_messages(task: Drb2Task, items: list[str], article: str) -> list[dict[str, str]]:
    """The chat messages asking the judge about ``items`` (one batch of ``task``) in ``article``."""
    rubric = json.dumps({"task": task.task, "rubric_items": items, "blocked": task.blocked},
                        ensure_ascii=False, indent=2)
    text = (f"{INSTRUCTIONS}\n\n<passage>\n{article.strip()}\n</passage>\n"
            f"<task_and_rubric>\n{rubric}\n</task_and_rubric>\n")
    return [{"role": "user", "content": text}]


# ---------------------------------------------------------------------------------------- parsing
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_QUOTES = str.maketrans({c: "'" for c in "‘’‚‛′`"} | {c: '"' for c in "“”„‟″「」『』"})
_TRAIL = " \t\n.。;；,，:：!！"


def normalise_item(text: str) -> str:
    """The item as compared when an echo is not exact: NFKC, one kind of quote, whitespace collapsed,
    case folded, final punctuation dropped."""
    text = unicodedata.normalize("NFKC", str(text)).translate(_QUOTES)
    return " ".join(text.split()).casefold().strip(_TRAIL)


def _results(text: str) -> list[Any]:
    """The first ``{"results": [...]}`` object (or a bare list of objects) in the reply."""
    text = _THINK.sub("", text or "")
    decoder = json.JSONDecoder()
    for match in re.finditer(r"[\[{]", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            if isinstance(value.get("results"), list):  # data, not config
                return value["results"]
            lists = [v for v in value.values() if isinstance(v, list) and v and all(isinstance(e, dict) for e in v)]
            if len(lists) == 1:  # {"items": [...]} or another single list of entries
                return lists[0]
        elif isinstance(value, list) and value and all(isinstance(e, dict) for e in value):
            return value
    raise ReplyError(f'no {{"results": [...]}} object in reply: {text[:200]!r}')


def coerce_score(value: Any) -> int:
    """1, 0 or -1 from an int, a float equal to one, or such a string; else :class:`ReplyError`."""
    if isinstance(value, bool):
        raise ReplyError(f"score {value!r} is not 1, 0 or -1")
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ReplyError(f"score {value!r} is not 1, 0 or -1") from None
    if isinstance(value, (int, float)) and value in SCORES:
        return int(value)
    raise ReplyError(f"score {value!r} is not 1, 0 or -1")


def _entry_text(entry: dict) -> str | None:
    for key in ("rubric_item", "item", "rubric"):
        if isinstance(entry.get(key), str):
            return entry[key]
    return None


def parse_batch_reply(text: str, items: list[str]) -> dict[str, dict[str, Any]]:
    """``{item: {"score", "reason", "evidence"}}`` for every distinct item of the batch, else ReplyError.

    An entry answers the item it echoes exactly, else the one it matches after
    :func:`normalise_item`; when the reply has exactly one entry per batch position, an entry that
    matches no item answers the item at its position if that one is still unanswered. Entries for
    items outside the batch are ignored; of two answers for one item the last counts (as DRB-II,
    which keys results by item text).
    """
    entries = _results(text)
    wanted = list(dict.fromkeys(items))
    by_norm: dict[str, list[str]] = {}
    for item in wanted:
        by_norm.setdefault(normalise_item(item), []).append(item)
    out: dict[str, dict[str, Any]] = {}
    unmatched: list[tuple[int, dict]] = []
    for pos, entry in enumerate(entries):
        if not isinstance(entry, dict):
            continue
        echoed = _entry_text(entry)
        target = None
        if echoed is not None and echoed in wanted:
            target = echoed
        elif echoed is not None and len(by_norm.get(normalise_item(echoed), [])) == 1:
            target = by_norm[normalise_item(echoed)][0]
        if target is None:
            unmatched.append((pos, entry))
            continue
        out[target] = _answer(entry, target)
    if len(entries) == len(items):
        for pos, entry in unmatched:
            if items[pos] not in out:
                out[items[pos]] = {**_answer(entry, items[pos]), "matched_by_position": True}
    missing = [item for item in wanted if item not in out]
    if missing:
        raise ReplyError(f"{len(missing)} of {len(wanted)} rubric items unanswered, e.g. {missing[0][:80]!r}; "
                         "answer every item, copying its text exactly")
    return out


def _answer(entry: dict, item: str) -> dict[str, Any]:
    if "score" not in entry:
        raise ReplyError(f"no score for rubric item {item[:80]!r}")
    evidence = entry.get("evidence") or ""
    if isinstance(evidence, list):  # several quoted sentences
        evidence = "\n".join(str(e) for e in evidence)
    return {"score": coerce_score(entry["score"]), "reason": str(entry.get("reason") or ""),  # data, not config
            "evidence": str(evidence)}
