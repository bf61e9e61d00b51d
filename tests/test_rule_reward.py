"""The known-good reward R = a(r) * (1 + q(r)), against hand computations."""

from __future__ import annotations

import pytest
import torch

from score_lightning.rewards.rule import qualities, rule_quality, rule_rewards


def test_retrieved_cited_is_the_share_of_what_it_read_that_it_cites():
    assert rule_quality("retrieved_cited", ["a", "b"], ["a", "b", "c", "d"]) == pytest.approx(0.5)
    assert rule_quality("retrieved_cited", ["a", "z"], ["a", "a", "b"]) == pytest.approx(0.5)  # distinct ids
    assert rule_quality("retrieved_cited", ["a"], []) == 0.0


def test_coverage_is_the_share_of_the_top_passages_it_cites():
    assert rule_quality("coverage", ["t1", "x"], ["x"], ["t1", "t2", "t3"]) == pytest.approx(1 / 3)
    assert rule_quality("coverage", ["t1"], ["t1"], []) == 0.0
    assert rule_quality("none", ["a"], ["a"], ["a"]) == 0.0
    with pytest.raises(ValueError, match="reward.rule_quality"):
        rule_quality("bleu", [], [])


def test_rule_rewards_by_hand():
    validity = torch.tensor([1.0, 0.0, 1.0, 1.0])
    q = qualities("retrieved_cited", [["a"], ["a", "b"], ["a", "b"], []], [["a", "b"], ["a", "b"], ["a", "b"], ["c"]])
    assert q.tolist() == pytest.approx([0.5, 1.0, 1.0, 0.0])
    assert rule_rewards(validity, q).tolist() == pytest.approx([1.5, 0.0, 2.0, 1.0])  # invalid: 0 whatever q
    with pytest.raises(ValueError, match="shape"):
        rule_rewards(validity, q[:2])


def test_a_rule_step_trains_on_the_rule_reward_without_any_evaluation(tmp_path, tiny_ckpt, corpus_file):
    """reward.source=rule in a real SCORE step (scripted engine, non-zero rewards): no scoring rollout runs, and
    the rewards are a(r)(1 + q) by hand, q = the share of the retrieved documents the report cites."""
    from test_grounded_rewards import NEVER_RETRIEVED, _run, _solver

    bodies = {0: "A detailed report on the question [{cite}]. Conclusion: alpha beta.",
              1: "A report citing what it never saw [" + NEVER_RETRIEVED + "]. Conclusion: gamma.",
              2: "A report with no citation at all, long enough. Conclusion: delta."}

    def respond(req):
        assert req.role == "solver", req.role  # the rule arm never asks the evaluator for anything
        return _solver(req, bodies)

    rec, engine = _run(tmp_path, ["solver.num_rollouts=3", "optim.micro_batch_size=3", "reward.citations=retrieved",
                                  "reward.source=rule", "verifier.enabled=false", "evaluator.enabled=false",
                                  "evaluator.static_rubric=true", "harness.enabled=false"], respond)
    step = rec.steps[0]
    rw, ro, m = step["rewards"], step["rollouts"], step["metrics"]
    assert ro.scoring == [] and all(b[0][0] == "solver" for b in engine.batches if b)
    retrieved = ro.solver[0].retrieved_ids
    assert rw.validity.tolist() == [1.0, 0.0, 0.0]
    assert rw.rewards.tolist() == pytest.approx([1.0 + 1.0 / len(set(retrieved)), 0.0, 0.0])
    assert step["solver"].advantages.abs().sum() > 0 and m["solver/reward_mean"] > 0
    assert m["solver/reward_score_part"] == pytest.approx(1.0 / len(set(retrieved)))


def test_the_rule_source_refuses_what_needs_an_evaluation():
    from helpers import compose
    from score_lightning.launch.config_validation import ConfigError, validate_config

    validate_config(compose(["experiment=rule_tiny"]))
    with pytest.raises(ConfigError, match="reward.source=rule with verifier.enabled=true"):
        validate_config(compose(["experiment=rule_tiny", "verifier.enabled=true"]))
    with pytest.raises(ConfigError, match="reward.source=rule with evaluator.reward=discriminative"):
        validate_config(compose(["experiment=rule_tiny", "evaluator.enabled=true", "evaluator.reward=discriminative"]))
    with pytest.raises(ConfigError, match="reward.rule_quality='bleu'"):
        validate_config(compose(["experiment=rule_tiny", "reward.rule_quality=bleu"]))
