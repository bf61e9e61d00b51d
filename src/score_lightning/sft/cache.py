"""The identity of an SFT result: the cache key over every input that changes the trained weights,
and where the checkpoint for a key lives.

``<key>`` hashes the base checkpoint's files, the ``sft`` config (minus knobs that do not change
weights), the demo-generation and training versions, the corpus / retriever, the query file, the
harness's initial state and the RL budgets. Kept apart from training so the key can be computed
(and tested) without Lightning.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from score_lightning.paths import corpus_path
from score_lightning.sft.demo_types import demo_budgets
from score_lightning.sft.demos import DEMO_VERSION
from score_lightning.sft.workflow_demos import workflow_key_inputs

#: Bump when the training procedure changes (loss, schedule, saving), so caches are invalidated.
SFT_FORMAT_VERSION = 1
META_FILE = "sft_meta.json"
#: ``sft`` keys that do not change the trained weights (excluded from the cache key)
_NON_KEY_FIELDS = ("enabled", "cache_dir", "log_every_n_steps", "probe", "log_samples", "shared_prompt", "use_packaged")
#: files above this size are hashed by (size, first and last MiB) instead of their full content
_FULL_HASH_LIMIT = 256 << 20


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    size = path.stat().st_size
    h.update(str(size).encode())
    with open(path, "rb") as fh:
        if size <= _FULL_HASH_LIMIT:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        else:
            h.update(fh.read(1 << 20))
            fh.seek(size - (1 << 20))
            h.update(fh.read(1 << 20))
    return h.hexdigest()


def checkpoint_digest(model_path: str | os.PathLike) -> str:
    """Hash of a local checkpoint directory's files (names + contents); a hub id hashes as its name."""
    p = Path(model_path)
    if not p.is_dir():
        return "hub:" + str(model_path)
    h = hashlib.sha256()
    for f in sorted(x for x in p.rglob("*") if x.is_file()):
        h.update(str(f.relative_to(p)).encode())
        h.update(_file_digest(f).encode())
    return h.hexdigest()


def _retriever_identity(cfg: DictConfig) -> dict[str, Any]:
    """What the demonstrations' observations depend on.

    In-process BM25: the corpus file's content. An HTTP server: its URL, because the trainer cannot
    see what the server indexes or how it ranks; ``retriever.serves_local_corpus=true`` declares
    that the server is ``scripts/serve_retriever.py`` over the same corpus file, and the cold start
    is then keyed (and reused) exactly as with ``retriever=bm25``.
    """
    r = cfg.retriever
    if r.kind == "bm25" or bool(r.serves_local_corpus):  # (retriever=bm25 has no serves_local_corpus: never read)
        return {"kind": "bm25", "corpus": _file_digest(corpus_path(cfg))}
    return {"kind": str(r.kind), "url": str(r.url)}


def _queries_identity(cfg: DictConfig) -> str:
    from score_lightning.data.queries import EMBEDDED_QUERIES_PATH

    path = cfg.data.queries_path or EMBEDDED_QUERIES_PATH
    return _file_digest(Path(path))


#: sft knobs added after cold starts were cached: at these values they change nothing, so they are not keyed
_OFF_VALUES = {"trainable_layers": None, "scoring_contrast": 0.0, "report": None, "scoring_targets": "kind",
               "scoring_kind_weights": None}


def _items_identity(cfg: DictConfig) -> str:
    """The evidence items ``sft.scoring_targets=items`` reads: the file's digest (the embedded one by default)."""
    from score_lightning.data.items import EMBEDDED_ITEMS_PATH, file_digest

    path = cfg.reward.items_path
    return file_digest(path if path else EMBEDDED_ITEMS_PATH)


def _budgets(cfg: DictConfig) -> dict[str, Any]:
    """The demo budgets as key inputs; a switch that is off (``passages``: None) is left out, so keys made before
    it existed still hold."""
    out = asdict(demo_budgets(cfg.solver, cfg.evaluator))
    if out["passages"] is None:
        del out["passages"]
    return out


def sft_key_inputs(cfg: DictConfig, model_path: str) -> dict[str, Any]:
    """Everything the SFT result depends on, as a JSON-able dict (hashed into the cache key)."""
    s = OmegaConf.to_container(cfg.sft, resolve=True)
    for k in _NON_KEY_FIELDS:
        s.pop(k, None)
    for knob, off in _OFF_VALUES.items():  # a knob at its "off" value leaves every existing key (the packaged) as is
        if s[knob] == off:
            del s[knob]
    if not s["workflow_demos"]:  # no counts set: keys made before the schema gave every run this node hold
        del s["workflow_demos"]
    if not s["lora"]["enabled"]:  # all weights train: the adapter's shape is no input
        del s["lora"]
    elif float(s["lora"]["alpha"]).is_integer():  # the schema types alpha as a number (16.0); keys made before it
        s["lora"]["alpha"] = int(s["lora"]["alpha"])  # (cold_start_smol's) hold the integer the YAML wrote
    return {
        "base": checkpoint_digest(model_path),
        "sft": s,
        "demo_version": DEMO_VERSION,
        "format_version": SFT_FORMAT_VERSION,
        "retriever": _retriever_identity(cfg),
        "queries": [_queries_identity(cfg), str(cfg.data.split)],
        "harness_initial_state": OmegaConf.to_container(cfg.harness.initial_state, resolve=True),
        "budgets": _budgets(cfg),
        "dtype": str(cfg.model.dtype),
        **workflow_key_inputs(cfg),  # {} for the default cold start, so its key is unchanged
        **({"items": _items_identity(cfg)} if "scoring_targets" in s else {}),  # the items the scores follow
        # results trained with gradient checkpointing before the packed shared prompt saw no prompt (HF dropped
        # the prompt's key/value cache in checkpointed layers): a new key so those caches are not reused;
        # without checkpointing (the tiny model) the key, and the packaged cold start, are unchanged
        **({"prompt_context": "packed"} if cfg.model.gradient_checkpointing else {}),
    }


def sft_cache_dir(cfg: DictConfig) -> Path:
    """``sft.cache_dir``, else ``<paths.cache_dir>/sft``: shared across runs so unchanged inputs reuse a result."""
    d = cfg.sft.cache_dir
    return Path(d) if d else Path(cfg.paths.cache_dir) / "sft"


def sft_output_path(cfg: DictConfig, model_path: str) -> tuple[Path, dict[str, Any]]:
    """The checkpoint directory for this config's key, and the key's inputs (saved in its metadata)."""
    inputs = sft_key_inputs(cfg, model_path)
    key = hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return sft_cache_dir(cfg) / f"sft-{key}", inputs


def is_complete(path: Path) -> bool:
    """Whether ``path`` holds a usable cached checkpoint (model config and SFT metadata both present)."""
    return (path / META_FILE).is_file() and (path / "config.json").is_file()
