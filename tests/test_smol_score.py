"""``experiment=smol_score`` as a user runs it from a fresh cache: GGUF conversion, the packaged LoRA cold start
installed, SCORE steps, export, and ``scripts/evaluate.py`` rolling the export out (``make test-slow``; the train
command took 5 min 9 s for 2 steps on 2 cores; half an hour more when the package is stale and the cold start trains)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from helpers import ROOT, read_scalars

pytestmark = pytest.mark.slow


def test_smol_score_from_a_fresh_cache_logs_finite_scalars_and_exports(tmp_path):
    out, cache = tmp_path / "run", tmp_path / "cache"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), SCORE_LIGHTNING_CACHE=str(cache), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "src/train.py", "experiment=smol_score", "trainer.max_steps=3",
                           f"paths.output_dir={out}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=5400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert list((cache / "models").glob("gguf-smollm2-135m-instruct-*/gguf_manifest.json"))
    scalars = read_scalars(out / "tensorboard")
    assert [s for s, _ in scalars["solver/reward_mean"]] == [0, 1, 2]
    for tag in ("solver/reward_mean", "solver/entropy", "solver/kl", "time/rollout_s", "time/scoring_s", "time/update_s"):
        assert all(math.isfinite(v) for _, v in scalars[tag]), tag
    assert "sft/summary/loss" in scalars
    export = out / "export"
    # the top 6 layers train (model.trainable_layers): a whole checkpoint, no adapter
    assert list(export.glob("*.safetensors")) and not (export / "adapter").exists()
    queries = tmp_path / "query.jsonl"
    queries.write_text(json.dumps({"id": 1, "prompt": "How does the json module read a file?"}) + "\n")
    articles = tmp_path / "articles.jsonl"
    ev = subprocess.run([sys.executable, "scripts/evaluate.py", "--model", str(export), "--queries", str(queries),
                         "--out", str(articles), "--no-progress"], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=1200)
    assert ev.returncode == 0, ev.stderr[-3000:]
    rows = [json.loads(line) for line in articles.read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["id"] == 1 and isinstance(rows[0]["article"], str)
