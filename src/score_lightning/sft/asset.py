"""The packaged cold start of the default tiny model: a first run reaches RL in minutes, not a quarter hour.

``scripts/build_cold_start.py`` trains the cold start of ``experiment=tiny_score`` exactly as a run
would and stores it here with a manifest: the cache key it was built under (the hash of every
input: base checkpoint, demonstrations' inputs, SFT settings) and the sha256 of every file. A run
whose cold-start key equals the manifest's copies these files into its cache (verifying each hash)
instead of training; any changed input gives another key, and the cold start is trained as before.

The asset holds the checkpoint only: the cache directory's ``run_config.json`` (the installing run's
evaluation settings, written by ``sft/run.py``) is not packaged, so the asset does not depend on which
run built it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from score_lightning.evaluation.settings import RUN_CONFIG
from score_lightning.files import file_sha256

log = logging.getLogger(__name__)

ASSET_DIR = Path(__file__).resolve().parents[1] / "data" / "assets" / "cold_start"
MANIFEST = "manifest.json"


def packaged_key(asset: Path = ASSET_DIR) -> str | None:
    manifest = asset / MANIFEST
    return json.loads(manifest.read_text())["key"] if manifest.is_file() else None


def install_packaged(out: Path, asset: Path = ASSET_DIR) -> bool:
    """Copy the packaged cold start to ``out`` when its key is ``out``'s; False when it does not apply.

    Every file is checked against the manifest's sha256; a mismatch refuses the asset (and the
    caller trains), so a damaged checkout can never hand RL a corrupt model.
    """
    manifest = asset / MANIFEST
    if not manifest.is_file() or json.loads(manifest.read_text())["key"] != out.name:
        return False
    files = json.loads(manifest.read_text())["files"]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".tmp-asset-"))
    try:
        for name, digest in files.items():
            shutil.copyfile(asset / name, tmp / name)
            if file_sha256(tmp / name) != digest:
                log.warning("packaged cold start: %s does not match its manifest; training instead", name)
                shutil.rmtree(tmp, ignore_errors=True)
                return False
        os.rename(tmp, out)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        return out.is_dir()  # another process installed it first
    log.info("sft: installed the packaged cold start %s (no training)", out.name)
    return True


def package(built: Path, asset: Path = ASSET_DIR) -> dict:
    """Store a built cold start (a cache directory ``sft-<key>``) as the packaged asset."""
    if asset.exists():
        shutil.rmtree(asset)
    asset.mkdir(parents=True)
    files = {}
    for p in sorted(built.iterdir()):
        if p.is_file() and p.name != RUN_CONFIG:
            shutil.copyfile(p, asset / p.name)
            files[p.name] = file_sha256(p)
    manifest = {"key": built.name, "files": files}
    (asset / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest
