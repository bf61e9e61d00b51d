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

    The agent loop turns this into a "retrieval failed" observation instead of crashing a run. ``hits``, when
    set, holds per query its hits, or ``None`` where that query failed: a retriever whose queries fail one by
    one (MCP) keeps the others' results, and only the failed ones are counted.
    """

    def __init__(self, message: str, hits: list[list[SearchHit] | None] | None = None) -> None:
        super().__init__(message)
        self.hits = hits


class UnexpectedResult(RetrievalError):
    """The retriever answered, but not in a shape its client reads: the server is up and its results are not
    where the config looks for them, which is no outage (not retried; the message shows the shape)."""


def hits_or_failed(exc: RetrievalError, n: int) -> list[list[SearchHit] | None]:
    """Per query of a failed ``search`` of ``n`` queries: its hits, or ``None`` where it failed."""
    return list(exc.hits) if exc.hits is not None and len(exc.hits) == n else [None] * n
