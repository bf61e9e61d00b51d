"""Citations as a reader means them, and the one rule on what they must point at.

**What a citation is.** A bracketed corpus id that stands as a reference in prose: ``... as JSON
[json.dumps].``, ``... in 1932 [17].``, several in a row (``[a][b]``). Bracketed text that a reader
does not take for a reference is not one:

* a subscript or call: the brackets follow a name, a closing bracket or a quote
  (``sys.argv[1]``, ``d["k"]``, ``x[0][1]``, ``f(x)[0]``);
* a markdown link or image (``[text](url)``, ``![alt](img)``) and a link definition
  (``[ref]: https://...`` at the start of a line);
* anything inside a code span (```` `sys.argv[1]` ````) or a fenced block (```` ``` ```` or ``~~~``).

Why it matters: the embedded corpus is the Python standard library's documentation, where
``sys.argv[1]`` is everywhere. Read as a citation of id ``1``, it made a report that cites only what it
retrieved invalid under ``reward.citations=retrieved``.

**The grounding rule.** :func:`cites_only_retrieved` (a report cites at least one id, and every id it
cites was retrieved) is the one function the reward, the cold-start probe, the report card, the article
writer and the judge call; :func:`citation_precision` (the share of distinct cited ids that were
retrieved) is the one graded measure beside it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from score_lightning.data.corpus import LOADABLE_ID_RE

#: one bracketed id, exactly the ids ``load_corpus`` accepts (no whitespace, no brackets)
_GROUP = rf"\[(?:{LOADABLE_ID_RE.pattern})\]"
#: a run of adjacent bracketed ids: ``[a]``, ``[a][b]``, ``x[0][1]``'s ``[0][1]``
_CHAIN_RE = re.compile(rf"(?:{_GROUP})+")
_ID_RE = re.compile(rf"\[({LOADABLE_ID_RE.pattern})\]")
#: a character after which brackets index or call something instead of citing
_SUBSCRIPT_BEFORE = re.compile(r"[\w)\]}\"'`]")
_FENCE_RE = re.compile(r"^[ \t]{0,3}(`{3,}|~{3,})[^\n]*\n.*?(?:^[ \t]{0,3}\1[ \t]*$|\Z)", re.MULTILINE | re.DOTALL)
_CODE_SPAN_RE = re.compile(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)


def _blank(match: re.Match) -> str:
    return re.sub(r"[^\n]", " ", match.group(0))


def mask_code(text: str) -> str:
    """``text`` with fenced blocks and code spans blanked out (same length, newlines kept)."""
    return _CODE_SPAN_RE.sub(_blank, _FENCE_RE.sub(_blank, text))


def citation_spans(text: str) -> list[tuple[int, int, str]]:
    """``(start, end, id)`` of every citation in ``text``, in order (the rule in the module docstring)."""
    if not isinstance(text, str) or "[" not in text:
        return []
    masked = mask_code(text)
    spans: list[tuple[int, int, str]] = []
    for chain in _CHAIN_RE.finditer(masked):
        start, end = chain.span()
        if start > 0 and _SUBSCRIPT_BEFORE.match(masked[start - 1]):
            continue  # sys.argv[1], d["k"], x[0][1], f(x)[0]
        if masked.startswith("(", end) or (start > 0 and masked[start - 1] == "!"):
            continue  # [text](url), ![alt](img)
        line_start = masked.rfind("\n", 0, start) + 1
        if not masked[line_start:start].strip() and re.match(r":\s", masked[end:end + 2]):
            continue  # [ref]: https://... (a markdown link definition)
        for group in _ID_RE.finditer(masked, start, end):
            spans.append((group.start(), group.end(), group.group(1)))
    return spans


def cited_ids(text: str) -> tuple[str, ...]:
    """Unique cited ids in order of first citation."""
    return tuple(dict.fromkeys(doc_id for _, _, doc_id in citation_spans(text)))


def strip_citations(text: str) -> str:
    """Remove citations (only those: ``sys.argv[1]`` stays) and normalise whitespace, with no space left
    before punctuation."""
    spans = citation_spans(text)
    if spans:
        pieces, last = [], 0
        for start, end, _ in spans:
            pieces.append(text[last:start])
            last = end
        pieces.append(text[last:])
        text = " ".join(pieces)
    text = re.sub(r"\s+", " ", text).strip()
    return re.sub(r"\s+([.,;:!?])", r"\1", text)


def ungrounded_ids(cited: Iterable[str], retrieved: Iterable[str]) -> tuple[str, ...]:
    """The distinct cited ids that are not among ``retrieved``, in citation order."""
    seen = set(retrieved)
    return tuple(c for c in dict.fromkeys(cited) if c not in seen)


def cites_only_retrieved(cited: Sequence[str], retrieved: Iterable[str]) -> bool:
    """The grounding rule of a(r) under ``reward.citations=retrieved``: at least one citation, and every
    cited id among the ids the trajectory's own searches showed it."""
    return len(cited) > 0 and not ungrounded_ids(cited, retrieved)


def citation_precision(cited: Sequence[str], retrieved: Iterable[str]) -> float | None:
    """Share of the distinct cited ids that were retrieved; ``None`` when nothing is cited.

    The step logs it as ``solver/citation_validity`` and the report card as ``citation_precision``.
    """
    unique = list(dict.fromkeys(cited))
    if not unique:
        return None
    seen = set(retrieved)
    return sum(c in seen for c in unique) / len(unique)
