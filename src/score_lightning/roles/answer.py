"""The solver's final report: extraction, the validity a(r) and the conclusion used for consistency.

Validity a(r) of a solver trajectory (``parse_answer``) is 1 when **all** hold, else 0:

1. an ``<answer>…</answer>`` block exists; the *last* one in the text is used, and it starts at
   the first ``<answer>`` after the previous ``</answer>`` (so a nested ``<answer>`` is seen);
   an ``<answer>`` opened after the last ``</answer>`` means the final report never closed;
2. the trajectory was not truncated (``truncated=True``: length or turn limit hit);
3. the answer has at least ``min_chars`` non-whitespace characters (default 20);
4. no protocol tags are nested inside it: ``<search>``, ``</search>``, ``<answer>``,
   ``<observation>``, ``</observation>`` (a report that still tries to act is not a report);
5. with ``require_citation=True``, it cites at least one corpus id as ``[doc_id]``;
6. with ``require_grounded=True`` (``reward.citations=retrieved``), it cites at least one id and every
   cited id is among ``retrieved``, the ids that the trajectory's own searches showed it
   (:func:`~score_lightning.rewards.citations.cites_only_retrieved`). Without this rule any bracketed
   id passes, and RL learns to cite without citing what it read.

What counts as a citation (a bracketed id standing as a reference in prose; not ``sys.argv[1]``, a
markdown link or code) is :mod:`score_lightning.rewards.citations`.

The first failing rule is given as ``reason``; ``format_valid`` says whether rules 1-5 hold, so the
share of otherwise valid reports that cite an unretrieved id stays observable under either rule. Citations are collected from the answer even when
it is invalid, so citation metrics can still look at them.

``extract_conclusion`` gives the text the evaluator's consistency reward compares across the K
reports of one query (see its docstring for the rule).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from score_lightning.protocol import ANSWER_CLOSE, ANSWER_OPEN, OBS_CLOSE, OBS_OPEN, SEARCH_CLOSE, SEARCH_OPEN
from score_lightning.rewards.citations import cited_ids, cites_only_retrieved, strip_citations, ungrounded_ids

__all__ = ["AnswerParse", "cited_ids", "extract_conclusion", "parse_answer", "strip_citations"]

_NESTED_TAGS = (SEARCH_OPEN, SEARCH_CLOSE, ANSWER_OPEN, OBS_OPEN, OBS_CLOSE)
_CONCLUSION_MARKER_RE = re.compile(
    r"(?:^|(?<=[.!?])[ \t]+)[ \t*_#>\-]*(?:conclusion\s*:|in\s+conclusion\b|overall\s*,)",
    re.IGNORECASE | re.MULTILINE,
)
_PARAGRAPH_SPLIT_RE = re.compile(r"\n[ \t]*\n")
_SENTENCE_SPLIT_RE = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True)
class AnswerParse:
    answer: str | None  # stripped answer text, None when no <answer> block exists
    valid: bool
    reason: str  # "" when valid
    cited_ids: tuple[str, ...]  # unique, in order of first citation
    format_valid: bool = False  # rules 1-5 hold (validity before the grounding rule)
    ungrounded: tuple[str, ...] = ()  # cited ids the trajectory never retrieved (empty when not checked)


def _last_answer_block(text: str) -> tuple[str | None, str]:
    close = text.rfind(ANSWER_CLOSE)
    if close < 0:
        return None, f"missing {ANSWER_CLOSE}" if ANSWER_OPEN in text else f"no {ANSWER_OPEN} block"
    prev_close = text.rfind(ANSWER_CLOSE, 0, close)
    search_from = 0 if prev_close < 0 else prev_close + len(ANSWER_CLOSE)
    open_ = text.find(ANSWER_OPEN, search_from, close)
    if open_ < 0:
        return None, f"{ANSWER_CLOSE} without {ANSWER_OPEN}"
    if ANSWER_OPEN in text[close:]:
        return None, f"missing {ANSWER_CLOSE} after the last {ANSWER_OPEN}"
    return text[open_ + len(ANSWER_OPEN) : close], ""


def parse_answer(
    text: str, truncated: bool = False, *, require_citation: bool = False, min_chars: int = 20,
    retrieved: Sequence[str] | None = None, require_grounded: bool = False,
) -> AnswerParse:
    """The final report and its validity a(r) (rules in the module docstring). Never raises.

    ``retrieved``: the ids the trajectory's searches returned. Given, ``ungrounded`` lists the cited ids
    outside it; ``require_grounded`` makes them (or no citation at all) invalidate the report. They also
    resolve a bracket attached to a word (``it[17]``: a citation when ``17`` was retrieved).
    """
    if not isinstance(text, str):
        return AnswerParse(None, False, "not text", ())
    raw, reason = _last_answer_block(text)
    if raw is None:
        return AnswerParse(None, False, reason, ())
    answer = raw.strip()
    cites = cited_ids(answer, known_ids=set(retrieved) if retrieved is not None else None)
    nested = next((t for t in _NESTED_TAGS if t in answer), None)
    n_chars = sum(1 for c in answer if not c.isspace())
    if truncated:
        reason = "truncated"
    elif nested is not None:
        reason = f"nested {nested} inside answer"
    elif n_chars < min_chars:
        reason = f"answer too short ({n_chars} < {min_chars} non-space chars)"
    elif require_citation and not cites:
        reason = "no citation"
    format_ok = not reason
    ungrounded: tuple[str, ...] = ()
    if retrieved is not None or require_grounded:
        ungrounded = ungrounded_ids(cites, retrieved or ())
    if require_grounded and format_ok and not cites_only_retrieved(cites, retrieved or ()):
        reason = f"cites an id it never retrieved ([{ungrounded[0]}])" if ungrounded else "no citation"
    return AnswerParse(answer, not reason, reason, cites, format_ok, ungrounded)


def extract_conclusion(answer: str) -> str:
    """The report's conclusion, by a fixed rule (so consistency compares like with like):

    1. if a line or sentence starts with ``Conclusion:``, ``In conclusion`` or ``Overall,``
       (case-insensitive, markdown markers like ``**`` or ``#`` allowed before it), the text after
       the *last* such marker, up to the end of the answer;
    2. else, when the answer has several paragraphs (blank-line separated), the last non-empty one;
    3. else (a single paragraph), its last sentence.

    A rule whose result is empty falls through to the next. Citations are stripped and whitespace
    normalised. Returns ``""`` for empty or non-text input. Never raises.
    """
    if not isinstance(answer, str) or not answer.strip():
        return ""
    markers = list(_CONCLUSION_MARKER_RE.finditer(answer))
    if markers:
        tail = answer[markers[-1].end() :]
        tail = strip_citations(tail).lstrip(" *_:,;.-").strip()
        if tail:
            return tail
    paragraphs = [p for p in _PARAGRAPH_SPLIT_RE.split(answer) if strip_citations(p)]
    if len(paragraphs) > 1:
        return strip_citations(paragraphs[-1])
    sentences = [s for s in _SENTENCE_SPLIT_RE.split(answer.strip()) if strip_citations(s)]
    return strip_citations(sentences[-1]) if sentences else ""
