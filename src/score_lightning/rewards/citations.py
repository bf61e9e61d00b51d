"""Citations as a reader means them, and the one rule on what they must point at.

**What a citation is.** A bracketed corpus id that stands as a reference in prose: ``... as JSON
[json.dumps].``, ``... in 1932 [17].``, several in a row (``[a][b]``). Bracketed text that a reader
does not take for a reference is not one:

* a subscript or call: the brackets follow a closing bracket or a quote (``x[0][1]``'s second group,
  ``d["k"]``), a call's parenthesis (``f(x)[0]``, below), or an ASCII identifier and hold an index or key
  (below);
* a markdown link or image (``[text](url)``, ``![alt](img)``) and a link definition
  (``[ref]: https://...`` at the start of a line);
* anything inside a code span (```` `sys.argv[1]` ````) or a fenced block (```` ``` ```` or ``~~~``).

**Brackets right after a word.** Citations are often written without a space (``standard[json.dumps].``,
``In 1932[17]``, and always in Chinese: ``序列化对象[json.dumps]。``), and so are subscripts
(``sys.argv[1]``, ``d[k]``). A run of adjacent groups (``x[0][1]``, ``[a][b]``) is decided by its first
group, by the token it is attached to, the maximal run of ASCII word characters ``[A-Za-z0-9_]``
before it:

* no ASCII token (a CJK or other non-ASCII letter before the bracket): a citation. Code does not index
  Chinese words, and in Chinese prose every citation sits there.
* a number (``1932[17]``, ``发布于2020[3]``): a citation. A number is not indexed; digits after digits are
  a footnote.
* an identifier (``argv``, ``x1``, ``standard``): a citation only when the group holds a dotted name
  (``json.dumps``, ``argparse.Action-2``: parts joined by ``.``, each starting with a letter or digit)
  or an id in ``known_ids``. Everything else reads as code: an integer (``argv[1]``: digits after an
  identifier are an index), a bare name (``d[k]``, ``x[i]``), a slice or expression (``a[i:j]``,
  ``heap[2*k+1]``), a quoted key, an attribute with a private part (``modules[obj.__module__]``).

**Brackets right after a parenthesis.** ``f(x)[0]`` indexes a call, but ``数据(见下)[doc-1]。`` cites after a
parenthetical remark. The ``(`` matching the ``)`` (on the same line) decides:

* an ASCII word character, a closing bracket or a quote right before it (``f(x)[0]``, ``items()[2]``,
  ``g()(x)[0]``): a call, code whatever the group holds;
* a non-ASCII letter right before it, or one inside the parentheses (``数据(见下)[doc-1]``,
  ``data (见下)[doc-1]``): a citation, as after a CJK word;
* else an ASCII remark after a space or at the start (``(see below)[json.dumps]``, ``(a, b)[1]``): as after an
  identifier, a citation only of a dotted name or an id in ``known_ids``. No matching ``(``: code.

So ``it[17]`` and ``standard[pathlib]`` are ambiguous without context and read as code; a caller that
knows the ids a citation could name (the trajectory's retrieved ids, the corpus's ids) passes them as
``known_ids``, and an id in that set attached to a word is always a citation. ``known_ids`` only adds
citations, so an attached dotted id that was never retrieved is still read, and still ungrounded. Left
ambiguous on purpose: a dotted attribute used as a key (``d[args.name]``) reads as a citation.

Why it matters: the embedded corpus is the Python standard library's documentation, where
``sys.argv[1]`` is everywhere. Read as a citation of id ``1``, it made a report that cites only what it
retrieved invalid under ``reward.citations=retrieved``; read no citation after a word at all, every
Chinese report was uncited.

**The grounding rule.** :func:`cites_only_retrieved` (a report cites at least one id, and every id it
cites was retrieved) is the one function the reward, the cold-start probe, the report card, the article
writer and the judge call; :func:`citation_precision` (the share of distinct cited ids that were
retrieved) is the one graded measure beside it.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence

from score_lightning.data.corpus import LOADABLE_ID_RE

#: one bracketed id, exactly the ids ``load_corpus`` accepts (no whitespace, no brackets)
_GROUP = rf"\[(?:{LOADABLE_ID_RE.pattern})\]"
#: a run of adjacent bracketed ids: ``[a]``, ``[a][b]``, ``x[0][1]``'s ``[0][1]``
_CHAIN_RE = re.compile(rf"(?:{_GROUP})+")
_ID_RE = re.compile(rf"\[({LOADABLE_ID_RE.pattern})\]")
#: a character after which brackets index or call something instead of citing
_SUBSCRIPT_BEFORE = re.compile(r"[)\]}\"'`]")
_WORD = re.compile(r"\w")
_ASCII_WORD = re.compile(r"[A-Za-z0-9_]")
#: a group's content that reads as a document id even right after an identifier: a dotted name
_DOTTED_ID_RE = re.compile(r"[A-Za-z0-9][\w-]*(?:\.[A-Za-z0-9][\w-]*)+", re.ASCII)
_FENCE_RE = re.compile(r"^[ \t]{0,3}(`{3,}|~{3,})[^\n]*\n.*?(?:^[ \t]{0,3}\1[ \t]*$|\Z)", re.MULTILINE | re.DOTALL)
_CODE_SPAN_RE = re.compile(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)


def _blank(match: re.Match) -> str:
    return re.sub(r"[^\n]", " ", match.group(0))


def mask_code(text: str) -> str:
    """``text`` with fenced blocks and code spans blanked out (same length, newlines kept)."""
    return _CODE_SPAN_RE.sub(_blank, _FENCE_RE.sub(_blank, text))


def _attached_cites(masked: str, start: int, first_id: str, known_ids: Collection[str]) -> bool:
    """Whether a run of groups right after a word character is a citation (rule in the module docstring)."""
    i = start
    while i > 0 and _ASCII_WORD.match(masked[i - 1]):
        i -= 1
    token = masked[i:start]
    if not token or token.isdigit():
        return True  # after a CJK / non-ASCII letter, or after a number (1932[17])
    return first_id in known_ids or bool(_DOTTED_ID_RE.fullmatch(first_id))


def _after_parenthesis(masked: str, close: int, first_id: str, known_ids: Collection[str]) -> bool:
    """Whether a run of groups right after the ``)`` at ``close`` is a citation (rule in the module docstring)."""
    depth, line_start = 0, masked.rfind("\n", 0, close) + 1
    for i in range(close, line_start - 1, -1):
        depth += {")": 1, "(": -1}.get(masked[i], 0)
        if depth == 0:
            break
    else:
        return False  # no matching "(" on the line
    opener = masked[i - 1] if i > 0 else ""
    if opener and (_ASCII_WORD.match(opener) or _SUBSCRIPT_BEFORE.match(opener)):
        return False  # f(x)[0], items()[2], g()(x)[0]
    remark = masked[i + 1:close]
    if (opener and not opener.isascii() and _WORD.match(opener)) or any(not c.isascii() and c.isalpha() for c in remark):
        return True  # 数据(见下)[doc-1], data (见下)[doc-1]
    return first_id in known_ids or bool(_DOTTED_ID_RE.fullmatch(first_id))


def citation_spans(text: str, known_ids: Collection[str] | None = None) -> list[tuple[int, int, str]]:
    """``(start, end, id)`` of every citation in ``text``, in order (the rule in the module docstring).

    ``known_ids``: ids a citation may name (retrieved or corpus ids); one of them attached to a word cites.
    """
    if not isinstance(text, str) or "[" not in text:
        return []
    known = known_ids if known_ids is not None else ()
    masked = mask_code(text)
    spans: list[tuple[int, int, str]] = []
    for chain in _CHAIN_RE.finditer(masked):
        start, end = chain.span()
        groups = list(_ID_RE.finditer(masked, start, end))
        before = masked[start - 1] if start > 0 else ""
        if before == ")":
            if not _after_parenthesis(masked, start - 1, groups[0].group(1), known):
                continue  # f(x)[0], (a, b)[1]
        elif before and _SUBSCRIPT_BEFORE.match(before):
            continue  # x[0][1]'s second group, d["k"]
        if before and _WORD.match(before) and not _attached_cites(masked, start, groups[0].group(1), known):
            continue  # sys.argv[1], d[k], a[i:j]
        if masked.startswith("(", end) or before == "!":
            continue  # [text](url), ![alt](img)
        line_start = masked.rfind("\n", 0, start) + 1
        if not masked[line_start:start].strip() and re.match(r":\s", masked[end:end + 2]):
            continue  # [ref]: https://... (a markdown link definition)
        spans.extend((group.start(), group.end(), group.group(1)) for group in groups)
    return spans


def cited_ids(text: str, known_ids: Collection[str] | None = None) -> tuple[str, ...]:
    """Unique cited ids in order of first citation (``known_ids``: see :func:`citation_spans`)."""
    return tuple(dict.fromkeys(doc_id for _, _, doc_id in citation_spans(text, known_ids)))


def strip_citations(text: str, known_ids: Collection[str] | None = None) -> str:
    """Remove citations (only those: ``sys.argv[1]`` stays) and normalise whitespace, with no space left
    before punctuation (the full-width ``。，`` of Chinese prose too)."""
    spans = citation_spans(text, known_ids)
    if spans:
        pieces, last = [], 0
        for start, end, _ in spans:
            pieces.append(text[last:start])
            last = end
        pieces.append(text[last:])
        text = " ".join(pieces)
    text = re.sub(r"\s+", " ", text).strip()
    return re.sub(r"\s+([.,;:!?。，、；：！？])", r"\1", text)


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
