"""Build the configured retriever (the ``retriever`` config group) for a run."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from score_lightning.retrieval.base import Retriever
from score_lightning.retrieval.factory import build_retriever

if TYPE_CHECKING:
    from score_lightning.config.schema import HttpRetrieverConfig, McpRetrieverConfig, RetrieverConfig


def retriever_from_config(rcfg: "RetrieverConfig | HttpRetrieverConfig | McpRetrieverConfig",
                          cache_dir: str | Path) -> Retriever:
    """``rcfg``: the ``retriever`` node; each ``kind`` reads the keys of its own option (``configs/retriever/``)."""
    if rcfg.kind == "bm25":
        from score_lightning.data.corpus import default_corpus_path

        corpus = rcfg.corpus_path or default_corpus_path(Path(cache_dir) / "corpus")
        return build_retriever("bm25", corpus_path=corpus, index_dir=rcfg.index_dir)
    if rcfg.kind == "http":
        return build_retriever(
            "http", url=rcfg.url, timeout_s=float(rcfg.timeout_s), max_retries=int(rcfg.max_retries),
            backoff_s=float(rcfg.backoff_s),
            token_env=str(rcfg.token_env or "SCORE_RETRIEVER_TOKEN"),  # null: the variable the server reads
        )
    if rcfg.kind == "mcp":
        from omegaconf import OmegaConf

        def plain(value):  # a list or mapping node as the MCP client takes it; None stays None
            return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value

        return build_retriever(
            "mcp", tool=str(rcfg.tool), url=rcfg.url, command=plain(rcfg.command), query_arg=str(rcfg.query_arg),
            topk_arg=rcfg.topk_arg, extra_args=plain(rcfg.extra_args), fields=plain(rcfg.fields),
            timeout_s=float(rcfg.timeout_s), connect_timeout_s=float(rcfg.connect_timeout_s),
            max_retries=int(rcfg.max_retries), env=plain(rcfg.env))
    return build_retriever(rcfg.kind)
