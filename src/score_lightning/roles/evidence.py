"""The initial evidence D_q^0 = R(q) as the rubric prompt shows it: each document's id and what it is.

Ids alone tell the evaluator nothing when they are numbers (wiki-18's are), so each document comes
with its title, or, when the title says no more than the id (the stdlib corpus's ids are titles,
``json.loads`` or a chunk of it, ``json.loads-2``), the opening ~30 tokens of its text. Whole passages would crowd the prompt: the rubric
prompt lists up to ``evaluator.rubric_queries`` queries with ``solver.topk`` documents each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: words of a label; ~30 tokens of English prose for common BPE vocabularies
EVIDENCE_WORDS = 24


def _clip(text: str, words: int = EVIDENCE_WORDS) -> str:
    parts = text.split()
    return " ".join(parts[:words]) + (" ..." if len(parts) > words else "")


@dataclass(frozen=True)
class EvidenceDoc:
    """One document of D_q^0: its id (what a report cites) and a short label (what it is about)."""

    id: str
    label: str = ""

    @classmethod
    def from_hit(cls, hit) -> "EvidenceDoc":
        """From a :class:`~score_lightning.retrieval.base.SearchHit`: its title, else its opening words."""
        title = hit.title.strip()
        return cls(str(hit.id), _clip(title if title and title not in str(hit.id) else hit.text))

    def line(self) -> str:
        return f"[{self.id}] {self.label}" if self.label else f"[{self.id}]"


def evidence_from_hits(hits: Sequence[Sequence]) -> list[list[EvidenceDoc]]:
    """D_q^0 per query from a retriever's answer (one hit list per query)."""
    return [[EvidenceDoc.from_hit(h) for h in row] for row in hits]
