"""The packaged cold start of the default tiny model: a first run reaches RL in minutes, not a quarter hour.

``scripts/build_cold_start.py`` trains the cold start of ``experiment=tiny_score`` exactly as a run
would and stores it here with a manifest: the cache key it was built under (the hash of every
input: base checkpoint, demonstrations' inputs, SFT settings) and the sha256 of every file. A run
whose cold-start key equals the manifest's copies these files into its cache (verifying each hash)
instead of training; any changed input gives another key, and the cold start is trained as before.

The asset holds the checkpoint only: the cache directory's ``run_config.json`` (the installing run's
evaluation settings, written by ``sft/run.py``) is not packaged, so the asset does not depend on which
run built it.

Every folder under ``data/assets/`` with a manifest is a packaged cold start; the one whose key is the
run's is installed. A LoRA cold start (``sft.lora.enabled``, :mod:`~score_lightning.sft.adapter_asset`)
is packaged as its adapter (SmolLM2: 13.4 MB with its tokenizer): installing it merges the adapter into
the run's base checkpoint.
Its manifest also names the base it was trained on and a digest of every other key input, so a run of
the same recipe on another base (a changed GGUF, say) is told by name why the package does not apply.

An install that fails never retrains silently (SmolLM2's cold start trains for about 25 minutes). A
cause that training would meet too is refused with :class:`~score_lightning.errors.ColdStartUnavailable`:
a full disk or quota, a cache directory it may not write, a base checkpoint it cannot read. Any other
failure (a package file missing or unreadable, a stale network handle) logs a warning naming the
package, the target and the error, and the cold start is trained.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from score_lightning.errors import ColdStartUnavailable
from score_lightning.data.run_config import RUN_CONFIG
from score_lightning.files import file_sha256

log = logging.getLogger(__name__)

ASSETS = Path(__file__).resolve().parents[1] / "data" / "assets"
ASSET_DIR = ASSETS / "cold_start"  # experiment=tiny_score's (all weights of the tiny model)
MANIFEST = "manifest.json"


def packaged_key(asset: Path = ASSET_DIR) -> str | None:
    manifest = asset / MANIFEST
    return json.loads(manifest.read_text())["key"] if manifest.is_file() else None


def packaged_assets(root: Path = ASSETS) -> list[Path]:
    """Every packaged cold start: the folders under ``root`` with a manifest."""
    return sorted(p.parent for p in root.glob(f"*/{MANIFEST}")) if root.is_dir() else []


def recipe_digest(inputs: dict[str, Any]) -> str:
    """A digest of a cold start's key inputs without its base checkpoint: the same recipe on any base."""
    rest = {k: v for k, v in inputs.items() if k != "base"}
    return hashlib.sha256(json.dumps(rest, sort_keys=True, default=str).encode()).hexdigest()[:16]


def install_packaged(out: Path, asset: Path | None = None, base_path: str | Path | None = None,
                     inputs: dict[str, Any] | None = None) -> bool:
    """Install the packaged cold start whose key is ``out``'s; False when none applies (the caller trains).

    ``asset``: that package only (default: every one under ``data/assets``). A LoRA package needs
    ``base_path``, the run's base checkpoint, to merge into. Every file is checked against the manifest's
    sha256; a mismatch refuses the asset, so a damaged checkout never hands RL a corrupt model. With
    ``inputs`` (the run's key inputs), a package of the same recipe on another base is named in a warning.
    """
    candidates = [asset] if asset is not None else packaged_assets()
    manifests = {a: json.loads((a / MANIFEST).read_text()) for a in candidates if (a / MANIFEST).is_file()}
    match = next((a for a, m in manifests.items() if m["key"] == out.name), None)
    if match is None:
        if inputs is not None:
            for a, m in manifests.items():
                if m.get("recipe") == recipe_digest(inputs):
                    log.warning("sft: the packaged cold start %s (%s) was trained on base %s, this run's base is "
                                "%s: it does not apply, so the cold start is trained", a.name, m["key"],
                                str(m.get("base"))[:16], str(inputs.get("base"))[:16])
        return False
    manifest = manifests[match]
    tmp: Path | None = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".tmp-asset-"))
        for name, digest in manifest["files"].items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(match / name, tmp / name)
            if file_sha256(tmp / name) != digest:
                log.warning("packaged cold start %s: %s does not match its manifest; training instead", match.name,
                            name)
                shutil.rmtree(tmp, ignore_errors=True)
                return False
        if manifest.get("adapter"):
            if base_path is None:
                raise ValueError(f"the packaged cold start {match.name} is a LoRA adapter: installing it needs the "
                                 "base checkpoint")
            from score_lightning.sft.adapter_asset import ADAPTER_DIR, rebuild_from_adapter

            try:
                dtype = manifest.get("dtype", "float32")  # data, not config
                rebuild_from_adapter(base_path, tmp / ADAPTER_DIR, tmp, manifest["lora"], dtype)
            except OSError as exc:
                if _within(exc.filename, tmp) or exc.errno in _DISK_FULL:
                    raise  # writing the result: judged below like any other write
                raise _base_refusal(match, out, base_path, exc) from exc
        os.rename(tmp, out)
    except OSError as exc:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if out.is_dir():
            return True  # another process installed it first
        _refuse_or_warn(exc, match, out, base_path)
        return False
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("sft: installed the packaged cold start %s from %s (no training)", out.name, match.name)
    return True


#: causes that do not fix themselves, and that training the cold start instead would meet too
_DISK_FULL = {errno.ENOSPC, errno.EDQUOT}
_NOT_WRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS}


def _within(name: object, root: Path | str | None) -> bool:
    """Whether the path an ``OSError`` names lies under ``root``."""
    if root is None or not isinstance(name, (str, os.PathLike)):
        return False
    return Path(os.path.abspath(name)).is_relative_to(os.path.abspath(root))


def _refusal(asset: Path, out: Path, why: str, exc: OSError, fix: str) -> ColdStartUnavailable:
    return ColdStartUnavailable(f"the packaged cold start {asset.name} could not be installed into {out}: {why} "
                                f"({type(exc).__name__}: {exc}). Training it instead would meet the same error after "
                                f"minutes of work, so the run stops: {fix}")


def _base_refusal(asset: Path, out: Path, base_path: str | Path | None, exc: OSError) -> ColdStartUnavailable:
    return _refusal(asset, out, f"cannot read the base checkpoint {base_path}", exc,
                    "restore it, or delete its cache directory so the run builds it again")


def _refuse_or_warn(exc: OSError, asset: Path, out: Path, base_path: str | Path | None) -> None:
    """Raise :class:`ColdStartUnavailable` for a cause that persists; else log why the cold start is trained."""
    where = "sft.cache_dir (or paths.cache_dir) elsewhere"
    if not _within(exc.filename, asset):  # a package file of its own: the package is unusable, training is not
        if exc.errno in _DISK_FULL:
            raise _refusal(asset, out, f"the disk or quota under {out.parent} is full", exc,
                           f"free space there, or point {where}") from exc
        if exc.errno in _NOT_WRITABLE:
            raise _refusal(asset, out, f"this process may not write {exc.filename or out.parent}", exc,
                           f"make it writable, or point {where}") from exc
        if exc.errno == errno.ENOENT and _within(exc.filename, base_path):
            raise _base_refusal(asset, out, base_path, exc) from exc
    log.warning("sft: could not install the packaged cold start %s into %s (%s: %s); training it instead",
                asset.name, out, type(exc).__name__, exc)


def package(built: Path, asset: Path = ASSET_DIR) -> dict:
    """Store a built cold start (a cache directory ``sft-<key>``) as a packaged asset: all its files, or, for a
    LoRA cold start, all but the merged weights (the adapter, tokenizer and metadata)."""
    from score_lightning.sft.cache import META_FILE

    meta = json.loads((built / META_FILE).read_text()) if (built / META_FILE).is_file() else {}
    lora = (meta.get("inputs", {}).get("sft") or {}).get("lora")  # data, not config
    if asset.exists():
        shutil.rmtree(asset)
    asset.mkdir(parents=True)
    if lora:
        from score_lightning.sft.adapter_asset import adapter_files

        paths = adapter_files(built)
    else:
        paths = sorted(p for p in built.iterdir() if p.is_file())
    files = {}
    for p in paths:
        name = str(p.relative_to(built))
        if name == RUN_CONFIG:
            continue
        (asset / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p, asset / name)
        files[name] = file_sha256(p)
    manifest: dict[str, Any] = {"key": built.name, "files": files}
    if lora:
        manifest.update(adapter=True, lora=lora, dtype=meta["inputs"].get("dtype", "float32"),  # data, not config
                        base=meta["inputs"]["base"], recipe=recipe_digest(meta["inputs"]))
    (asset / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest
