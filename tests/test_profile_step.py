"""scripts/profile_step.py reaches every stage it names: a module move that leaves a wrapped name behind fails here
(the script once raised AttributeError on ``module.solver_rollouts`` after the step's stages moved)."""

from __future__ import annotations

import sys

from helpers import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import profile_step  # noqa: E402

#: the scripted engine earns non-zero rewards, so the solver and evaluator updates both run
STEP = ["experiment=tiny_score", "sft.enabled=false", "rollout=scripted", "solver.num_rollouts=2",
        "data.batch_size=1", "optim.ppo_epochs=1", "optim.mini_batch_size=1", "optim.micro_batch_size=2",
        "solver.max_response_tokens=200", "evaluator.max_response_tokens=300", "evaluator.max_rubric_tokens=160",
        "callbacks.collapse_guard.enabled=false", "solver.max_tool_calls=1", "evaluator.max_tool_calls=1"]


def test_every_stage_is_timed_and_the_summary_line_is_printed(tmp_path, tiny_ckpt, capsys, monkeypatch):
    assert profile_step.main(["--steps", "2", *STEP, f"paths.output_dir={tmp_path}"], patch=monkeypatch.setattr) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    stage_lines = [line for line in lines if line.startswith("  rubric ")]
    assert len(stage_lines) == 2, lines
    for label in ("rubric", "solver rollouts", "scoring", "solver update", "old/ref log-probs", "forward (grad)",
                  "backward", "optimiser", "evaluator update"):
        assert f"{label} " in stage_lines[0], (label, stage_lines[0])
    summary = dict(kv.split("=", 1) for kv in lines[-1].split())
    assert summary["steps"] == "2"
    # the wrapped stages account for the step: each is timed (> 0) and no stage outlasts the step
    step_s = float(summary["step_s_median"])
    parts = [float(summary[key]) for key in ("rollouts_s", "scoring_s", "update_s")]
    assert all(0 < part <= step_s for part in parts) and sum(parts) <= step_s * 1.01, (parts, step_s)
    assert float(summary["peak_rss_mb"]) > 100
    assert (tmp_path / "checkpoints").is_dir() or any(tmp_path.iterdir())
