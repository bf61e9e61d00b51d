"""Minimal edits of a report: the same text with one known flaw, and nothing else changed.

Two users, one home, so the flaws the evaluator is taught to see are the ones it is measured on:

* the scoring demos of the cold start (:mod:`score_lightning.sft.scoring_demos`) score a good report beside
  its edits, so the scores must follow the one thing that differs;
* ``scripts/bench_evaluator.py`` (:mod:`score_lightning.evaluation.pair_build`) pairs a sampled,
  grounded-valid report with each of its edits and asks whether the evaluator scores the original higher.

The edits (pure functions of the text; the random choices come from the caller's ``rng``):

* :func:`drop_citations`: every citation removed (a report that cites nothing);
* :func:`replace_citation` with :func:`invented_id` (an id no corpus holds, ``json.helper``) or
  :func:`unretrieved_id` (a real corpus id that the report's own searches never returned);
* :func:`cut_short`: the conclusion dropped and the rest cut to its first half;
* off-topic (another query's report) and empty (no report) need no text function.

What a citation is comes from :mod:`score_lightning.rewards.citations`, the reward's own rule: an edit that
dropped ``sys.argv[1]``'s ``[1]`` or missed ``数据(见下)[doc-1]`` would differ from its original in more, or
less, than the one flaw. ``known_ids`` (the report's retrieved ids) resolves attached citations as there.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterable

from score_lightning.rewards.citations import citation_spans, cited_ids

#: the suffixes an invented id gets (``json.dumps`` -> ``json.helper``)
INVENTED_SUFFIXES = ("helper", "fast_path", "legacy", "internal")


def bracketed_ids(text: str, known_ids: Collection[str] | None = None) -> list[str]:
    """The distinct cited ids of ``text`` in order, as the reward reads them."""
    return list(cited_ids(text, known_ids))


def drop_citations(text: str, known_ids: Collection[str] | None = None) -> str:
    """``text`` with every citation (and the space before it) removed; other brackets (``argv[1]``) stay."""
    pieces, last = [], 0
    for start, end, _ in citation_spans(text, known_ids):
        pieces.append(text[last:start].rstrip())
        last = end
    pieces.append(text[last:])
    return "".join(pieces).replace("According to ,", "According to the docs,")


def replace_citation(text: str, old: str, new: str, known_ids: Collection[str] | None = None) -> str:
    """Every citation of ``old`` cited as ``new`` instead (``x[old]`` as code stays)."""
    pieces, last = [], 0
    for start, end, doc_id in citation_spans(text, known_ids):
        if doc_id == old:
            pieces.append(f"{text[last:start]}[{new}]")
            last = end
    pieces.append(text[last:])
    return "".join(pieces)


def invented_id(cited: str, rng: random.Random) -> str:
    """An id shaped like ``cited`` that names nothing: its last dotted part swapped (``json.helper``)."""
    return cited.rsplit(".", 1)[0] + "." + rng.choice(INVENTED_SUFFIXES)


def unretrieved_id(rng: random.Random, known_ids: Iterable[str], retrieved: Iterable[str]) -> str:
    """A real corpus id (one of ``known_ids``) that is not among ``retrieved`` (``os.path`` when none is)."""
    pool = sorted(set(known_ids) - set(retrieved)) or ["os.path"]
    return rng.choice(pool)


def cut_short(text: str) -> str:
    """The report cut short: everything from its ``Conclusion:`` line on dropped, then the first half of
    the words kept (at least 4)."""
    text = text.split("\nConclusion:")[0]
    words = text.split(" ")
    return " ".join(words[: max(4, len(words) // 2)])
