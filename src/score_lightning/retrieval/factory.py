"""Build a retriever by name (Hydra configs may instead instantiate the classes directly)."""

from __future__ import annotations

from score_lightning.retrieval.base import Retriever

RETRIEVER_KINDS = ("bm25", "http", "mcp")


def build_retriever(kind: str, **kwargs) -> Retriever:
    """``bm25``: ``BM25Retriever(corpus_path, index_dir, k1, b)``; ``http``: ``HTTPRetriever(url, ...)``;
    ``mcp``: ``MCPRetriever(tool, url | command, ...)``.

    For ``bm25`` a missing or ``None`` ``corpus_path`` means the cached stdlib corpus.
    """
    if kind == "bm25":
        from score_lightning.data.corpus import default_corpus_path
        from score_lightning.retrieval.bm25 import BM25Retriever

        if kwargs.get("corpus_path") is None:  # data, not config
            kwargs["corpus_path"] = default_corpus_path()
        return BM25Retriever(**kwargs)
    if kind == "http":
        from score_lightning.retrieval.http import HTTPRetriever

        return HTTPRetriever(**kwargs)
    if kind == "mcp":
        from score_lightning.retrieval.mcp import MCPRetriever

        return MCPRetriever(**kwargs)
    raise ValueError(f"retriever.kind must be one of {list(RETRIEVER_KINDS)}, got {kind!r}")
