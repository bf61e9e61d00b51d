"""What every retriever returns and promises: ranked ``SearchHit`` lists, one per query."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from score_lightning.data.corpus import parse_contents


@dataclass(frozen=True)
class SearchHit:
    """One retrieved passage; ``contents`` keeps the corpus' ``'"Title"\\ntext'`` form untouched."""

    id: str
    contents: str
    score: float

    @property
    def title(self) -> str:
        return parse_contents(self.contents)[0]

    @property
    def text(self) -> str:
        return parse_contents(self.contents)[1]


@runtime_checkable
class Retriever(Protocol):
    def search(self, queries: list[str], topk: int) -> list[list[SearchHit]]:
        """Return, for each query, at most ``topk`` hits ranked by score, best first."""
        ...


class RetrievalError(RuntimeError):
    """A remote retriever gave up (after retries, or at once for a client error).

    The agent loop turns this into a "retrieval failed" observation instead of crashing a run.
    """
