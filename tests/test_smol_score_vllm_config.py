"""``experiment=smol_score_vllm``: smol_score with its solver on vLLM; the config alone (no vLLM needed)."""

from __future__ import annotations


def test_smol_score_vllm_is_smol_score_with_the_solver_on_vllm():
    """``experiment=smol_score_vllm`` changes the engine and nothing a study compares: the same model, cold start,
    budgets and rewards; only the rollout group, the mismatch correction (vLLM's top-p log-probs) and the name."""
    from helpers import compose, flat_config
    from score_lightning.launch.config_validation import validate_config

    hf, vl = compose(["experiment=smol_score"]), compose(["experiment=smol_score_vllm"])
    validate_config(vl)
    a, b = flat_config(hf), flat_config(vl)
    changed = {k for k in set(a) | set(b) if a.get(k) != b.get(k)}
    allowed = ("rollout.", "callbacks.vllm_rollout.", "optim.rollout_correction", "task_name")
    assert changed and all(k.startswith(allowed) for k in changed), sorted(changed)
    assert (vl.rollout.engine, vl.rollout.evaluator_engine, vl.evaluator.score_readout) == ("vllm", "hf", "expected")
    assert vl.optim.rollout_correction == "none" and vl.solver.top_p < 1.0  # why the correction is off
