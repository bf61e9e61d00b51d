"""A fresh cache samples as a warm one does: building a cached input leaves the global RNG where it was.

``experiment=smol_score seed=N`` seeds before it converts the GGUF and installs the LoRA cold start. Both
build models whose initialisation (``from_config``'s weights, peft's ``lora_A``) draws from torch's global
generator, so, unpreserved, a fresh clone's run sampled differently from a warm cache's. Tiny stand-ins
keep these tests to seconds: the tiny checkpoint plays the GGUF's dequantised model and the LoRA base.
"""

from __future__ import annotations

import json
import random
import shutil

import numpy as np
import torch

LORA = {"enabled": True, "r": 4, "alpha": 8, "target_modules": "all-linear", "dropout": 0.0}


def _state() -> tuple:
    return torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()


def _same(a: tuple, b: tuple) -> bool:
    return torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]


def test_gguf_conversion_leaves_the_global_rng_alone(tmp_path, tiny_ckpt, monkeypatch):
    """``convert_gguf`` on a stand-in: ``from_pretrained(gguf_file=...)`` returns the tiny model, whose
    ``from_config`` copy draws its initial weights from the global generator."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from score_lightning.launch.gguf_checkpoint import MANIFEST, convert_gguf

    real_model, real_tok = AutoModelForCausalLM.from_pretrained, AutoTokenizer.from_pretrained
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained",
                        lambda path, gguf_file=None, **kw: real_model(str(tiny_ckpt), **kw))
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", lambda path, gguf_file=None, **kw: real_tok(str(tiny_ckpt)))
    torch.manual_seed(7)
    np.random.seed(7)
    random.seed(7)
    before = _state()
    convert_gguf(tmp_path / "pkg" / "model.gguf", tmp_path / "out", {"file": "model.gguf"})
    assert (tmp_path / "out" / MANIFEST).is_file()
    assert _same(before, _state())


def test_lora_cold_start_install_leaves_the_global_rng_alone(tmp_path, tiny_ckpt):
    """``install_packaged`` of a LoRA package loads the base with fresh LoRA layers (``lora_A`` drawn at
    random) before the adapter overwrites them."""
    from score_lightning.policy.models import load_policy
    from score_lightning.sft.adapter_asset import save_cold_start
    from score_lightning.sft.asset import install_packaged, package
    from score_lightning.sft.cache import META_FILE, is_complete

    built = tmp_path / "sft-00000000000000aa"
    save_cold_start(load_policy(tiny_ckpt, lora=LORA), built)
    for f in tiny_ckpt.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copyfile(f, built / f.name)
    (built / META_FILE).write_text(json.dumps({"inputs": {"sft": {"lora": LORA}, "base": "b", "dtype": "float32"}}))
    asset = tmp_path / "assets" / "lora"
    package(built, asset)

    torch.manual_seed(11)
    before = _state()
    fresh = tmp_path / "fresh" / built.name
    assert install_packaged(fresh, asset=asset, base_path=tiny_ckpt) and is_complete(fresh)
    assert _same(before, _state())
