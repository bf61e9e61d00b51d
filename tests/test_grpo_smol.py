"""``experiment=grpo_smol``: SmolLM2's static-rubric GRPO arm (issue 50's study past saturation).

The config alone in the default suite; a short run from the packaged cold start under ``make test-slow``.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from helpers import ROOT, compose, flat_config, read_scalars


def test_grpo_smol_is_smol_score_with_a_static_rubric_and_the_same_cold_start(tmp_path):
    """Only what makes it GRPO changes (no evaluator phase, the fallback rubric, no meta-harness); the model,
    budgets, rewards, scoring and the cold start's key stay smol_score's, so the arms start from one checkpoint."""
    from score_lightning.launch.config_validation import validate_config
    from score_lightning.sft.cache import sft_key_inputs

    score, grpo = compose(["experiment=smol_score"]), compose(["experiment=grpo_smol"])
    validate_config(grpo)
    a, b = flat_config(score), flat_config(grpo)
    changed = {k for k in set(a) | set(b) if a.get(k) != b.get(k)}
    assert changed == {"task_name", "evaluator.enabled", "evaluator.static_rubric", "harness.enabled"}, sorted(changed)
    assert (grpo.evaluator.enabled, grpo.evaluator.static_rubric, grpo.harness.enabled) == (False, True, False)
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    assert sft_key_inputs(score, str(base)) == sft_key_inputs(grpo, str(base))


@pytest.mark.slow
def test_grpo_smol_trains_two_steps_with_scores_and_no_evaluator_update(tmp_path):
    """Two steps from a fresh cache (GGUF conversion, the packaged adapter installed): the static rubric scores
    every report, so the solver's reward carries scores, and the evaluator never updates."""
    out, cache = tmp_path / "run", tmp_path / "cache"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), SCORE_LIGHTNING_CACHE=str(cache), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "src/train.py", "experiment=grpo_smol", "trainer.max_steps=2",
                           f"paths.output_dir={out}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=5400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    scalars = read_scalars(out / "tensorboard")
    assert [s for s, _ in scalars["solver/reward_mean"]] == [0, 1]
    assert all(math.isfinite(v) for _, v in scalars["solver/reward_mean"])
    # the cold start writes valid cited reports (held-out grounded validity 0.68), so 16 rollouts earn a reward:
    # a run whose rewards were all 0 would prove nothing about the arm
    assert max(v for _, v in scalars["solver/reward_mean"]) > 0
    assert "time/scoring_s" in scalars  # the static rubric still scores every report
    assert "evaluator/loss" not in scalars  # and nothing trains the evaluator
