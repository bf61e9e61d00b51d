#!/usr/bin/env python
"""Build the packaged cold start of ``experiment=tiny_score``, or check that it reproduces bit for bit.

    python scripts/build_cold_start.py            # train it (or take the cache) and store it in data/assets/cold_start
    python scripts/build_cold_start.py --check    # retrain in a fresh cache; compare every file's sha256

The cold start is trained exactly as ``python src/train.py experiment=tiny_score`` would (same
config, same key), with one torch thread per process so the float reductions run in one order.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("PROJECT_ROOT", str(ROOT))


def build(cache_dir: Path | None) -> Path:
    import torch
    from hydra import compose, initialize_config_dir

    from score_lightning.sft import run_sft
    from score_lightning.launch.training import resolve_model_path

    torch.set_num_threads(1)
    overrides = ["experiment=tiny_score", "sft.use_packaged=false"]
    if cache_dir is not None:
        overrides.append(f"paths.cache_dir={cache_dir}")
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides + [f"paths.output_dir={tempfile.mkdtemp()}"])
    return Path(run_sft(cfg, resolve_model_path(cfg)))


def main() -> int:
    from score_lightning.sft.asset import ASSET_DIR, MANIFEST, file_sha256, package

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="rebuild from scratch and compare with the packaged files")
    args = ap.parse_args()
    if not args.check:
        built = build(None)
        manifest = package(built)
        print(f"packaged {built.name}: {len(manifest['files'])} files -> {ASSET_DIR}")
        return 0
    import json

    want = json.loads((ASSET_DIR / MANIFEST).read_text())
    with tempfile.TemporaryDirectory() as tmp:
        built = build(Path(tmp))
        got = {p.name: file_sha256(p) for p in built.iterdir() if p.is_file()}
    from score_lightning.sft.cache import META_FILE

    same_key = built.name == want["key"]
    # the metadata records wall times; every other file (weights, tokenizer, config) must be identical
    diff = sorted(n for n in want["files"] if n != META_FILE and got.get(n) != want["files"][n])
    print(f"key {'matches' if same_key else 'differs: ' + built.name}; files differing: {diff or 'none'}")
    return 0 if same_key and not diff else 1


if __name__ == "__main__":
    sys.exit(main())
