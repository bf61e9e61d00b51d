"""The passages a report cites, shown to the evaluator under the report (``evaluator.show_passages``).

Why: the paper's evaluator verifies a report with searches of its own. A small evaluator cannot check a cited
claim whose source it never reads: with the ids alone (``evaluator.show_retrieved``) it can tell a grounded
citation from an ungrounded one, not a finding that says what its passage says from one that does not. With
this block each id the report cites comes with the passage's text, cut to ``evaluator.passage_tokens``, and
whether the report's own searches returned it, so that check is something the evaluator can read.

Where the text comes from (:func:`passage_texts`): the retriever's own corpus when it holds one (BM25 over a
local corpus: the passage as stored), else the text the solver's searches showed (a remote retriever: the
observation's part for that id). An id neither knows is shown as unknown.

Pure functions; the rollout (``step/rollouts.py``), the scoring demos and ``scripts/bench_evaluator.py`` build
the same block through :func:`cited_passages`, and the prompt renders it with :func:`passages_block`.
"""

from __future__ import annotations

import re
import weakref
from collections import ChainMap
from collections.abc import Callable, Collection, Mapping, Sequence

from score_lightning.rewards.citations import cited_ids

CITED_HEAD = "Cited passages:"
NOT_RETRIEVED = "(not returned by its searches)"
UNKNOWN = "(no such passage)"

#: ``[id] `` at the head of a line: how an observation lists its passages (``rollout.agent.format_observation``)
_HEAD_RE = re.compile(r"^\[([^\]\s]+)\] ", re.MULTILINE)

#: one cited passage as the evaluator is shown it: its id, its text (None: unknown), whether the report's searches
#: returned it
CitedPassage = tuple[str, str | None, bool]


def split_observation(body: str) -> list[tuple[str, str]]:
    """``(id, text)`` of each passage in an observation's body, in order (a passage's text may span lines)."""
    heads = list(_HEAD_RE.finditer(body))
    return [(m.group(1), body[m.end():heads[i + 1].start() if i + 1 < len(heads) else len(body)].strip())
            for i, m in enumerate(heads)]


_CORPUS_TEXTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def corpus_texts(retriever) -> Mapping[str, str] | None:
    """Every passage of the retriever's local corpus by id (its stored text), built once per retriever; None for
    a retriever without one (HTTP, MCP)."""
    docs = getattr(retriever, "docs", None)
    if not docs:
        return None
    try:
        return _CORPUS_TEXTS[retriever]
    except (KeyError, TypeError):
        texts = {d.id: d.text for d in docs}
        try:
            _CORPUS_TEXTS[retriever] = texts
        except TypeError:  # not weakly referenceable: rebuilt per call
            pass
        return texts


def passage_texts(corpus: Mapping[str, str] | None, shown: Mapping[str, str] | None) -> Mapping[str, str]:
    """The text of each passage id: the corpus' where it has one, else what the report's searches showed."""
    return ChainMap(corpus or {}, shown or {})


def cited_passages(report: str | None, retrieved: Collection[str], texts: Mapping[str, str], limit: int,
                   cut: Callable[[str], str] | None = None) -> list[CitedPassage]:
    """The first ``limit`` distinct ids ``report`` cites (as the reward reads citations), each with its text from
    ``texts`` (None when unknown; ``cut`` shortens a known one) and whether the report's searches returned it."""
    if not report or limit <= 0:
        return []
    seen = set(retrieved)
    out = []
    for d in cited_ids(report, known_ids=seen)[:limit]:
        text = texts.get(d)
        out.append((d, cut(text) if (cut is not None and text) else text, d in seen))
    return out


def passages_block(cited: Sequence[CitedPassage]) -> str:
    """``Cited passages:`` and one line per cited id: ``[id] text``, with the two notes the evaluator must see (a
    passage the searches never returned, an id no passage has); ``none`` when the report cites nothing."""
    if not cited:
        return f"{CITED_HEAD} none"
    lines = []
    for doc_id, text, retrieved in cited:
        note = "" if retrieved else f" {NOT_RETRIEVED}"
        lines.append(f"[{doc_id}]{note} {text}" if text else f"[{doc_id}]{note} {UNKNOWN}")
    return CITED_HEAD + "\n" + "\n".join(lines)
