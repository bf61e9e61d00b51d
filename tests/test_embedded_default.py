"""The embedded default as a user runs it: cold start, SCORE steps, export, resume (``make test-slow``)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from helpers import ROOT, read_scalars

pytestmark = pytest.mark.slow


def _train(args: list[str], timeout: int = 3600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, "src/train.py", "experiment=tiny_score", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def test_tiny_score_cold_start_steps_export_and_resume(tmp_path):
    out = tmp_path / "run"
    _train([f"paths.output_dir={out}", "trainer.max_steps=3"])
    scalars = read_scalars(out / "tensorboard")
    assert [s for s, _ in scalars["solver/reward_mean"]] == [0, 1, 2]
    assert "sft/loss" in scalars, "the cold start logs its curve under tensorboard/sft"
    # after the cold start the protocol is learnt: rubrics parse and some answers are valid
    assert max(v for _, v in scalars["evaluator/rubric_valid_rate"]) == 1.0
    assert max(v for _, v in scalars["solver/answer_valid_rate"]) > 0
    assert all(math.isfinite(v) for _, v in scalars["solver/entropy"])
    assert list((out / "export").glob("*.safetensors"))
    _train([f"paths.output_dir={out}", "trainer.max_steps=4", f"ckpt_path={out / 'checkpoints' / 'last.ckpt'}"])
    steps = [s for s, _ in read_scalars(out / "tensorboard")["solver/reward_mean"]]
    assert 3 in steps and steps.count(3) == 1
