"""Minimal edits of a report: the same text with one known flaw, and nothing else changed.

Two users, one home, so the flaws the evaluator is taught to see are the ones it is measured on:

* the scoring demos of the cold start (:mod:`score_lightning.sft.scoring_demos`) score a good report beside
  its edits, so the scores must follow the one thing that differs;
* ``scripts/bench_evaluator.py`` (:mod:`score_lightning.evaluation.pair_build`) pairs a sampled,
  grounded-valid report with each of its edits and asks whether the evaluator scores the original higher.

The edits (pure functions of the text; the random choices come from the caller's ``rng``):

* :func:`drop_citations`: every bracketed citation removed (a report that cites nothing);
* :func:`replace_citation` with :func:`invented_id` (an id no corpus holds, ``json.helper``) or
  :func:`unretrieved_id` (a real corpus id that the report's own searches never returned);
* :func:`cut_short`: the conclusion dropped and the rest cut to its first half;
* off-topic (another query's report) and empty (no report) need no text function.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable

#: a bracketed id as the demos write citations (``[json.dumps]``)
CITE_RE = re.compile(r"\[([^\]\s]+)\]")
_DROP_RE = re.compile(r"\s*\[[^\]\s]+\]")
#: the suffixes an invented id gets (``json.dumps`` -> ``json.helper``)
INVENTED_SUFFIXES = ("helper", "fast_path", "legacy", "internal")


def bracketed_ids(text: str) -> list[str]:
    """The distinct bracketed ids of ``text`` in order (the demos' reading; the reward's is
    :func:`score_lightning.rewards.citations.cited_ids`)."""
    return list(dict.fromkeys(CITE_RE.findall(text)))


def drop_citations(text: str) -> str:
    """``text`` with every bracketed citation (and the space before it) removed."""
    return _DROP_RE.sub("", text).replace("According to ,", "According to the docs,")


def replace_citation(text: str, old: str, new: str) -> str:
    """Every citation of ``old`` cited as ``new`` instead."""
    return text.replace(f"[{old}]", f"[{new}]")


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
