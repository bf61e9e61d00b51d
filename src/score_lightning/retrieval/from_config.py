"""Build the configured retriever (the ``retriever`` config group) for a run."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from score_lightning.retrieval.base import Retriever
from score_lightning.retrieval.factory import build_retriever


def retriever_from_config(rcfg: DictConfig, cache_dir: str | Path) -> Retriever:
    if rcfg.kind == "bm25":
        from score_lightning.data.corpus import default_corpus_path

        corpus = rcfg.get("corpus_path") or default_corpus_path(Path(cache_dir) / "corpus")
        return build_retriever("bm25", corpus_path=corpus, index_dir=rcfg.get("index_dir"))
    if rcfg.kind == "http":
        return build_retriever(
            "http", url=rcfg.url, timeout_s=float(rcfg.get("timeout_s", 10.0)),
            max_retries=int(rcfg.get("max_retries", 3)), backoff_s=float(rcfg.get("backoff_s", 0.25)),
            token_env=str(rcfg.get("token_env") or "SCORE_RETRIEVER_TOKEN"),
        )
    if rcfg.kind == "mcp":
        from omegaconf import OmegaConf

        plain = OmegaConf.to_container(rcfg, resolve=True)
        return build_retriever(
            "mcp", tool=str(plain["tool"]), url=plain.get("url"), command=plain.get("command"),
            query_arg=str(plain.get("query_arg") or "query"), topk_arg=plain.get("topk_arg"),
            extra_args=plain.get("extra_args") or {}, fields=plain.get("fields") or {},
            timeout_s=float(plain.get("timeout_s", 10.0)), connect_timeout_s=float(plain.get("connect_timeout_s", 5.0)),
            max_retries=int(plain.get("max_retries", 1)), env=plain.get("env"))
    return build_retriever(rcfg.kind)
