"""Build an items file and its manifest: what ``scripts/build_rubrics.py`` runs, and what the packaging test
rebuilds to compare digests.

The manifest ties the items to everything they were made from: the builder's settings, the query file's
digest and the corpus' (for the embedded stdlib corpus also the Python version it was read from, since the
corpus is that interpreter's own documentation). Two builds from the same inputs give one digest.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from score_lightning.data.items import QueryItems, file_digest, text_digest
from score_lightning.evaluation.items.synthesis import build_item_set
from score_lightning.retrieval.base import Retriever

#: Bump when the builder's output changes for the same inputs (the manifest records it).
BUILDER_VERSION = 1


@dataclass(frozen=True)
class BuildSettings:
    """The evidence tree's shape and how many items a query keeps (the script's flags)."""

    depth: int = 2
    branch: int = 3
    topk: int = 2
    max_items: int = 6
    min_items: int = 3


def build_items(queries: Sequence[tuple[str, str, dict]], retriever: Retriever, known_ids: frozenset[str],
                settings: BuildSettings = BuildSettings(), topics: Sequence[str] = ()) -> list[QueryItems]:
    """Items for every query, then one synthesised training query per topic."""
    return build_item_set(queries, retriever, known_ids, topics, **asdict(settings))


def manifest(items: list[QueryItems], text: str, settings: BuildSettings, *, queries_path: str | Path,
             corpus: dict, topics: Sequence[str] = (), command: str = "", reworded: dict | None = None) -> dict:
    """The manifest of a built items file (``text`` is exactly what was written)."""
    per_split: dict[str, list[int]] = {}
    for q in items:
        per_split.setdefault(str(q.extra.get("split", "train")), []).append(len(q.items))  # data, not config
    return {
        "builder": "scripts/build_rubrics.py", "builder_version": BUILDER_VERSION, "command": command,
        "settings": asdict(settings), "topics": list(topics),
        "queries": {"path": str(queries_path), "digest": file_digest(queries_path) if Path(queries_path).is_file()
                    else None, "count": len(items)},
        "corpus": corpus, "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "items": {"digest": text_digest(text), "count": sum(len(q.items) for q in items),
                  "min_per_query": {k: min(v) for k, v in sorted(per_split.items())},
                  "with_terms": sum(bool(it.terms) for q in items for it in q.items)},
        "reworded": reworded,
    }

