"""The packaged cold start of ``experiment=tiny_score`` (``data/assets/cold_start``).

A first run installs it instead of training for a quarter hour, but only while its key equals the
key the current code computes for ``tiny_score``. Any change to the demonstrations, the SFT
settings, the budgets or the tiny model silently falls back to training, so these tests fail the
moment the asset goes stale (rebuild it: ``python scripts/build_cold_start.py``), and check that a
damaged asset is refused rather than handed to RL.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil

import pytest

from helpers import compose
from score_lightning.errors import ColdStartUnavailable
from score_lightning.sft import adapter_asset
from score_lightning.sft import asset as asset_mod
from score_lightning.sft.asset import ASSET_DIR, MANIFEST, file_sha256, install_packaged, packaged_key
from score_lightning.sft.cache import is_complete, sft_output_path


def test_packaged_cold_start_matches_tiny_score_key(tiny_ckpt, corpus_file, cache_dir):
    cfg = compose(["experiment=tiny_score", f"paths.cache_dir={cache_dir}"])
    out, inputs = sft_output_path(cfg, str(tiny_ckpt))
    assert packaged_key() == out.name, (
        "data/assets/cold_start is stale for experiment=tiny_score: run `python scripts/build_cold_start.py`")
    assert inputs["sft"]["num_scoring_demos"] == cfg.sft.num_scoring_demos


def test_manifest_hashes_every_packaged_file():
    files = json.loads((ASSET_DIR / MANIFEST).read_text())["files"]
    on_disk = {p.name for p in ASSET_DIR.iterdir() if p.is_file() and p.name != MANIFEST}
    assert set(files) == on_disk and "model.safetensors" in files
    assert all(file_sha256(ASSET_DIR / name) == digest for name, digest in files.items())


def test_install_copies_a_complete_checkpoint_and_refuses_a_damaged_one(tmp_path):
    key = packaged_key()
    assert install_packaged(tmp_path / "sft-0000000000000000") is False  # another key: not applicable
    good = tmp_path / "good" / key
    assert install_packaged(good) is True and is_complete(good)
    assert file_sha256(good / "model.safetensors") == file_sha256(ASSET_DIR / "model.safetensors")

    damaged = tmp_path / "damaged_asset"
    shutil.copytree(ASSET_DIR, damaged)
    blob = bytearray((damaged / "model.safetensors").read_bytes())
    blob[-1] ^= 0xFF
    (damaged / "model.safetensors").write_bytes(bytes(blob))
    target = tmp_path / "bad" / key
    assert install_packaged(target, asset=damaged) is False and not target.exists()


def test_lora_cold_start_packages_its_adapter_and_installs_file_for_file(tmp_path, tiny_ckpt, corpus_file, cache_dir,
                                                                        caplog):
    """``sft.lora.enabled``: the cold start RL loads is a plain checkpoint (merged) whose embeddings are the base's;
    its package holds the adapter, not the weights; installing it on the same base rebuilds the trained files
    exactly; on another base it does not apply and says so by name; a damaged adapter is refused."""
    import logging

    import torch
    from omegaconf import open_dict
    from safetensors.torch import load_file

    from score_lightning.policy.lora import is_lora
    from score_lightning.policy.models import load_policy
    from score_lightning.sft import run_sft
    from score_lightning.sft.asset import package
    from score_lightning.sft.cache import checkpoint_digest
    from test_sft_training import _cfg

    cfg = _cfg(tmp_path, corpus_file, cache_dir, lora={"enabled": True, "r": 4, "alpha": 8,
                                                       "target_modules": "all-linear", "dropout": 0.0})
    out = run_sft(cfg, str(tiny_ckpt))
    assert (out / "adapter" / "adapter_model.safetensors").is_file() and not is_lora(load_policy(out))
    base, merged = load_file(str(tiny_ckpt / "model.safetensors")), load_file(str(out / "model.safetensors"))
    moved = {k for k in base if not torch.equal(base[k], merged[k])}
    assert moved and all(k.endswith("proj.weight") for k in moved), sorted(moved)[:4]  # linears only, merged in

    asset = tmp_path / "assets" / "cold_start_lora"
    manifest = package(out, asset)
    assert manifest["adapter"] is True and manifest["base"] == checkpoint_digest(tiny_ckpt)
    assert "model.safetensors" not in manifest["files"] and "adapter/adapter_model.safetensors" in manifest["files"]
    size = sum((asset / n).stat().st_size for n in manifest["files"])
    assert size < (out / "model.safetensors").stat().st_size / 4

    fresh = tmp_path / "fresh" / out.name
    assert install_packaged(fresh, asset=asset, base_path=tiny_ckpt) and is_complete(fresh)
    for name in ("model.safetensors", "adapter/adapter_model.safetensors", "config.json", "tokenizer.json"):
        assert file_sha256(fresh / name) == file_sha256(out / name), name

    other = tmp_path / "other_base"  # the same recipe on another base: its key differs, and the log says why
    shutil.copytree(tiny_ckpt, other)
    weights = load_file(str(other / "model.safetensors"))
    from safetensors.torch import save_file

    save_file({k: v + 1e-3 if k.endswith("norm.weight") else v for k, v in weights.items()},
              str(other / "model.safetensors"), metadata={"format": "pt"})
    from score_lightning.sft.cache import sft_output_path

    with open_dict(cfg):
        cfg.sft.cache_dir = str(tmp_path / "cache2")
    target, inputs = sft_output_path(cfg, str(other))
    with caplog.at_level(logging.WARNING, logger="score_lightning.sft.asset"):
        assert install_packaged(target, asset=asset, base_path=other, inputs=inputs) is False
    assert "cold_start_lora" in caplog.text and "this run's base" in caplog.text and not target.exists()

    damaged = tmp_path / "assets" / "damaged"
    shutil.copytree(asset, damaged)
    blob = bytearray((damaged / "adapter" / "adapter_model.safetensors").read_bytes())
    blob[-1] ^= 0xFF
    (damaged / "adapter" / "adapter_model.safetensors").write_bytes(bytes(blob))
    assert install_packaged(tmp_path / "bad" / out.name, asset=damaged, base_path=tiny_ckpt) is False



# ---------------------------------------------------------------- a failed install: say why, refuse what persists
def _oserror(code: int, path) -> OSError:
    return OSError(code, os.strerror(code), str(path))


def _fake_lora_asset(root):
    """A package that says it is a LoRA adapter (the tests replace its rebuild: only the error paths run)."""
    asset = root / "lora_asset"
    asset.mkdir(parents=True)
    (asset / "adapter.bin").write_bytes(b"adapter")
    manifest = {"key": "sft-00000000000000ff", "files": {"adapter.bin": file_sha256(asset / "adapter.bin")},
                "adapter": True, "lora": {"r": 4}, "dtype": "float32"}
    (asset / MANIFEST).write_text(json.dumps(manifest))
    return asset, manifest["key"]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_refuses_by_name_instead_of_retraining(tmp_path, monkeypatch, code):
    target = tmp_path / "cache" / packaged_key()

    def full(src, dst, *a, **k):
        raise _oserror(code, dst)

    monkeypatch.setattr(asset_mod.shutil, "copyfile", full)
    with pytest.raises(ColdStartUnavailable, match=rf"cold_start .*{tmp_path / 'cache'}.*{os.strerror(code)}"):
        install_packaged(target)
    assert not target.exists() and not list(target.parent.glob(".tmp-asset-*"))  # nothing half-written is left


def test_a_cache_dir_without_write_permission_is_refused(tmp_path, monkeypatch):
    def denied(*a, dir=None, **k):
        raise _oserror(errno.EACCES, dir)

    monkeypatch.setattr(asset_mod.tempfile, "mkdtemp", denied)
    with pytest.raises(ColdStartUnavailable, match=r"Permission denied.*sft\.cache_dir"):
        install_packaged(tmp_path / "cache" / packaged_key())


@pytest.mark.parametrize("error", [
    lambda base: _oserror(errno.ENOENT, base / "model.safetensors"),  # deleted since the key was computed
    lambda base: OSError(f"{base} does not appear to have a file named config.json"),  # transformers' own words
])
def test_an_unreadable_base_is_refused_naming_it(tmp_path, monkeypatch, error):
    asset, key = _fake_lora_asset(tmp_path)
    base = tmp_path / "base"

    def rebuild(base_path, *a, **k):
        raise error(base)

    monkeypatch.setattr(adapter_asset, "rebuild_from_adapter", rebuild)
    with pytest.raises(ColdStartUnavailable, match=rf"lora_asset.*base checkpoint {base}"):
        install_packaged(tmp_path / "cache" / key, asset=asset, base_path=base)


def test_a_transient_failure_says_why_and_falls_back_to_training(tmp_path, monkeypatch, caplog):
    """An error that may not recur (a stale NFS handle at the rename, a package file gone) logs a warning naming
    the package, the target and the error, then trains as before."""
    target = tmp_path / "cache" / packaged_key()

    def stale(src, dst):
        raise _oserror(errno.ESTALE, dst)

    monkeypatch.setattr(asset_mod.os, "rename", stale)
    with caplog.at_level(logging.WARNING, logger="score_lightning.sft.asset"):
        assert install_packaged(target) is False
    assert not target.exists() and not list(target.parent.glob(".tmp-asset-*"))
    assert f"cold start {ASSET_DIR.name}" in caplog.text and str(target) in caplog.text
    assert os.strerror(errno.ESTALE) in caplog.text and "training it instead" in caplog.text

    caplog.clear()
    monkeypatch.undo()
    asset, key = _fake_lora_asset(tmp_path / "gone")
    real_copy = shutil.copyfile

    def missing_in_package(src, dst, *a, **k):  # the package's own file: training does not need it
        if str(src).startswith(str(asset)):
            raise _oserror(errno.ENOENT, src)
        return real_copy(src, dst, *a, **k)

    monkeypatch.setattr(asset_mod.shutil, "copyfile", missing_in_package)
    with caplog.at_level(logging.WARNING, logger="score_lightning.sft.asset"):
        assert install_packaged(tmp_path / "cache" / key, asset=asset, base_path=tmp_path / "base") is False
    assert "lora_asset" in caplog.text and "adapter.bin" in caplog.text and "training it instead" in caplog.text


#: each relative's experiment and the packaged cold start it installs (``data/assets/<name>``), with the workflow
#: demos that make it its own (None: it shares tiny_score's demonstrations, and so its package)
RELATIVES = {
    "grpo_baseline": ("cold_start", None), "rule_tiny": ("cold_start", None), "given_tiny": ("cold_start", None),
    "evorubric_tiny": ("cold_start", None), "preference_tiny": ("cold_start", None),
    "rler_tiny": ("cold_start_items", "num_items"), "drrubric_tiny": ("cold_start_items", "num_items"),
    "rubricem_tiny": ("cold_start_rubricem", "num_rubricem"), "mams_tiny": ("cold_start_mams", "num_mams"),
    "arco_tiny": ("cold_start_arco", "num_step"),
    "rler_tiny rubric.evolve=false": ("cold_start_items", "num_items"),  # RLER's initial-items-only ablation
}


@pytest.mark.parametrize("experiment", sorted(RELATIVES))
def test_every_relative_installs_a_packaged_cold_start(experiment, tiny_ckpt, corpus_file, cache_dir):
    """Every relative's first run installs a package instead of training for half an hour: its key is the package's.
    RLER and DR-rubric share ``cold_start_items`` (their demos, and so their keys, are the same)."""
    from score_lightning.sft.asset import ASSETS

    name, demos = RELATIVES[experiment]
    asset = ASSETS / name
    cfg = compose([f"experiment={experiment.split()[0]}", *experiment.split()[1:], f"paths.cache_dir={cache_dir}"])
    out, inputs = sft_output_path(cfg, str(tiny_ckpt))
    assert packaged_key(asset) == out.name, (
        f"data/assets/{name} is stale for experiment={experiment}: run `python scripts/build_cold_start.py "
        f"--threads 1 --asset {name} experiment={experiment}`")
    if demos is not None:
        assert inputs["workflow_demos"][demos] > 0
        files = json.loads((asset / MANIFEST).read_text())["files"]
        assert all(file_sha256(asset / file) == digest for file, digest in files.items())


def test_smol_scores_lora_cold_start_keeps_its_recipe(corpus_file, cache_dir):
    """``experiment=smol_score``'s LoRA cold start (``data/assets/cold_start_smol``) still matches its recipe, the key
    without its base (``tests/test_smollm2.py`` checks the whole key, with the SmolLM2 GGUF): a config change that moves
    any other input, such as ``sft.lora.alpha`` entering the key as 16.0 instead of 16, fails in the default suite."""
    from score_lightning.sft.asset import ASSETS, recipe_digest
    from score_lightning.sft.cache import sft_key_inputs

    cfg = compose(["experiment=smol_score", f"paths.cache_dir={cache_dir}"])
    inputs = sft_key_inputs(cfg, "no-checkpoint")
    assert inputs["sft"]["lora"]["alpha"] == 16 and json.dumps(inputs["sft"]["lora"]["alpha"]) == "16"
    assert recipe_digest(inputs) == json.loads((ASSETS / "cold_start_smol" / MANIFEST).read_text())["recipe"]
