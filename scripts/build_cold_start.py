#!/usr/bin/env python
"""Build a packaged cold start (default: ``experiment=tiny_score``'s), or check that it reproduces bit for bit.

    python scripts/build_cold_start.py            # train it (or take the cache) and store it in data/assets/cold_start
    python scripts/build_cold_start.py --check    # retrain in a fresh cache; compare every file's sha256
    python scripts/build_cold_start.py --asset cold_start_smol experiment=smol_score sft.lora.enabled=true
                                                  # a LoRA cold start: its adapter alone is packaged

The cold start is trained exactly as ``python src/train.py <overrides>`` would (same config, same key),
with one torch thread per process (``--threads``) so the float reductions run in one order. A run whose key equals a
package's installs it instead of training (``score_lightning.sft.asset``).
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


def build(cache_dir: Path | None, recipe: list[str], threads: int = 1) -> Path:
    import torch
    from score_lightning.sft import run_sft
    from score_lightning.launch.training import resolve_model_path

    torch.set_num_threads(threads)
    overrides = [*recipe, "sft.use_packaged=false", f"threads.num={threads}"]
    if cache_dir is not None:
        overrides.append(f"paths.cache_dir={cache_dir}")
    from score_lightning.launch.schema import compose_config

    cfg = compose_config(overrides + [f"paths.output_dir={tempfile.mkdtemp()}"], ROOT / "configs")
    return Path(run_sft(cfg, resolve_model_path(cfg)))


def main() -> int:
    from score_lightning.sft.asset import ASSETS, MANIFEST, file_sha256, package

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="rebuild from scratch and compare with the packaged files")
    ap.add_argument("--asset", default="cold_start", help="the package's folder under data/assets/")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (a --check reproduces bit for bit only at the thread count the build used)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of the recipe (default experiment=tiny_score)")
    args = ap.parse_args()
    recipe = args.overrides or ["experiment=tiny_score"]
    asset = ASSETS / args.asset
    if not args.check:
        built = build(None, recipe, args.threads)
        manifest = package(built, asset)
        size = sum((asset / n).stat().st_size for n in manifest["files"])
        print(f"packaged {built.name}: {len(manifest['files'])} files, {size / 1e6:.1f} MB -> {asset}")
        return 0
    import json

    want = json.loads((asset / MANIFEST).read_text())
    with tempfile.TemporaryDirectory() as tmp:
        built = build(Path(tmp), recipe, args.threads)
        got = {str(p.relative_to(built)): file_sha256(p) for p in built.rglob("*") if p.is_file()}
    from score_lightning.sft.cache import META_FILE

    same_key = built.name == want["key"]
    # the metadata records wall times, and a LoRA adapter's config the building machine's base path (an install
    # merges the weights, not that file); every other file (weights, tokenizer, config) must be identical
    ignored = {META_FILE, "adapter/adapter_config.json"}
    diff = sorted(n for n in want["files"] if n not in ignored and got.get(n) != want["files"][n])
    print(f"key {'matches' if same_key else 'differs: ' + built.name}; files differing: {diff or 'none'}")
    return 0 if same_key and not diff else 1


if __name__ == "__main__":
    sys.exit(main())
