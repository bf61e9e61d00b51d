"""The embedded default as a user runs it: cold start (packaged, or trained), SCORE steps, export, resume (``make test-slow``)."""

from __future__ import annotations

import json
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
    # a fresh cache installs the packaged cold start (its key is tiny_score's): no training, its summary logged;
    # a trained one (another key, or sft.use_packaged=false) logs its curve too
    assert scalars["sft/summary/cache_hit"][-1][1] == 1.0 or "sft/loss" in scalars
    assert scalars["sft/summary/loss"][-1][1] < 1.0 and "sft/summary/probe/rubric_valid_rate" in scalars
    # after the cold start the protocol is learnt: rubrics parse and some answers are valid
    assert max(v for _, v in scalars["evaluator/rubric_valid_rate"]) == 1.0
    assert max(v for _, v in scalars["solver/answer_valid_rate"]) > 0
    assert all(math.isfinite(v) for _, v in scalars["solver/entropy"])
    assert list((out / "export").glob("*.safetensors"))
    _train([f"paths.output_dir={out}", "trainer.max_steps=4", f"ckpt_path={out / 'checkpoints' / 'last.ckpt'}"])
    steps = [s for s, _ in read_scalars(out / "tensorboard")["solver/reward_mean"]]
    assert 3 in steps and steps.count(3) == 1


def test_bench_learning_pipeline_produces_a_complete_table(tmp_path):
    """One short rule seed and one frozen-solver seed through the whole study, two horizons: completeness, not a
    winner. The summary lines parse, and every card was made under the cold start's settings."""
    import re

    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, "scripts/bench_learning.py", "--conditions", "rule,frozen_solver",
                           "--seeds", "1", "--steps", "2", "--horizons", "1,2", "--samples", "2", "--out", str(tmp_path),
                           "--no-append", "--figure", str(tmp_path / "study.png")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-2000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| rule |") or line.startswith("| frozen_solver |")]
    main = [r for r in rows if len(r.strip("|").split("|")) == 13]  # the main table; the health table follows
    assert len(main) == 2, rows
    health = proc.stdout.split("Health and cost")[1].splitlines()  # its columns: what the cells logged, then cost
    assert any(line.startswith("| condition |") and line.endswith("| s / step |") for line in health), proc.stdout[-2000:]
    assert "\nAt a glance" in proc.stdout and "pair=rule-frozen_solver seeds=1 " in proc.stdout
    line = re.compile(r"condition=(\w+) seeds=1 heldout_valid_delta=([+-]\d+\.\d{3}) heldout_valid_delta_ci=\[nan,nan\] "
                      r"heldout_recall_delta=([+-]\d+\.\d{3}) heldout_recall_delta_ci=\[nan,nan\] reward_slope=([+-]\d+\.\d{3}|nan) reward_slope_ci=\[nan,nan\]$")
    found = [m.group(1) for m in map(line.match, proc.stdout.splitlines()) if m]
    assert found == ["rule", "frozen_solver"], proc.stdout[-2000:]
    assert "| rule − frozen_solver | 1 |" in proc.stdout
    assert (tmp_path / "study.png").stat().st_size > 10_000
    for cond in ("rule", "frozen_solver"):
        result = json.loads((tmp_path / cond / "seed1" / "result.json").read_text())
        assert set(result["heldout"]) == {"1", "2"} and result["train"]["steps"] == 2
        assert {"grounded_valid", "format_valid", "citation_precision", "item_recall"} <= set(result["heldout"]["2"])
        assert 0.0 <= result["heldout"]["2"]["item_recall"] <= result["heldout"]["2"]["grounded_valid"]
        assert (tmp_path / cond / "seed1" / "export_s1" / "run_config.json").is_file()
