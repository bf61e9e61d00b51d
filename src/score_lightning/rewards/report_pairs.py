"""Two reports of one query with a known better side, as the verifier sees each: the pair's types.

Here, below ``evaluation/`` and ``methods/``, because both build them: ``scripts/bench_evaluator.py``
(:mod:`score_lightning.evaluation.pair_build`) pairs sampled reports with their edits
(:mod:`score_lightning.rewards.report_edits`) and with each other, and the packaged preference pairs
(:mod:`score_lightning.methods.preference.pairs`) become such pairs so the same benchmark measures a rubric
writer on them. A stored pair set (:mod:`score_lightning.evaluation.pair_set`) writes and reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

#: the degraded pairs' edit kinds, in the order they are built
EDIT_KINDS = ("no_citation", "unretrieved_citation", "truncated", "off_topic", "empty")
VALID = "valid"
ORIGINAL = "original"


@dataclass(frozen=True)
class Side:
    """One side of a pair as the verifier sees it."""

    text: str | None  # None: no report (shown to an evaluator as "(no report)")
    retrieved: tuple[str, ...]
    grounded_valid: bool
    item_recall: float | None  # None: the pair's query has no items
    satisfied: int  # items of the pair's query it satisfies (0 when not grounded-valid)
    words: int
    edit: str = ORIGINAL  # ORIGINAL or the edit kind
    source_query: str = ""  # the query whose rollout wrote it (off_topic: another one)
    sample: int = -1  # the rollout it came from


@dataclass(frozen=True)
class Pair:
    query_id: str
    query: str
    kind: str  # an EDIT_KINDS entry, or VALID
    sides: tuple[Side, Side]
    better: int  # 0 or 1: the side that is better by construction

    @property
    def group(self) -> str:
        return VALID if self.kind == VALID else "degraded"

    @property
    def worse(self) -> int:
        return 1 - self.better
