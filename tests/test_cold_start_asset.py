"""The packaged cold start of ``experiment=tiny_score`` (``data/assets/cold_start``).

A first run installs it instead of training for a quarter hour, but only while its key equals the
key the current code computes for ``tiny_score``. Any change to the demonstrations, the SFT
settings, the budgets or the tiny model silently falls back to training, so these tests fail the
moment the asset goes stale (rebuild it: ``python scripts/build_cold_start.py``), and check that a
damaged asset is refused rather than handed to RL.
"""

from __future__ import annotations

import json
import shutil

from helpers import compose
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
