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


def test_item_recall_quality_by_hand():
    from score_lightning.data.items import EvidenceItem

    items = [EvidenceItem("a", ("d1",), ("alpha",)), EvidenceItem("b", ("d2",), ("beta",)),
             EvidenceItem("c", ("d3",), ())]
    report = "Alpha holds [d1]; beta too [d2]."
    assert rule_quality("item_recall", ["d1", "d2"], ["d1", "d2"], report=report, items=items) == pytest.approx(2 / 3)
    assert rule_quality("item_recall", ["d1", "d2"], ["d1"], report=report, items=items) == pytest.approx(1 / 3)
    assert rule_quality("item_recall", [], ["d1"], report=report, items=()) == 0.0


def test_a_rule_step_rewards_item_recall(tmp_path, tiny_ckpt, corpus_file, bm25):
    """reward.rule_quality=item_recall in a real step: R = a(r)(1 + share of the query's items satisfied), with an
    items file whose two items per query both cite whatever the scripted search returns, one of them stated."""
    from score_lightning.data.queries import load_queries
    from score_lightning.data.items import EvidenceItem, QueryItems, items_lines
    from test_grounded_rewards import NEVER_RETRIEVED, _run, _solver

    entries = []
    for q in load_queries(None):
        found = [h.id for h in bm25.search([" ".join(q.prompt.split()[:3])], 2)[0]]  # what the script searches
        entries.append(QueryItems(q.id, q.prompt, [EvidenceItem("stated", tuple(found), ("detailed",)),
                                                    EvidenceItem("never stated", tuple(found), ("zeugma",))]))
    path = tmp_path / "items.jsonl"
    path.write_text(items_lines(entries))
    bodies = {0: "A detailed report on the question [{cite}]. Conclusion: alpha beta.",
              1: "A detailed report citing what it never saw [" + NEVER_RETRIEVED + "]. Conclusion: gamma.",
              2: "A report with no citation at all, long enough. Conclusion: delta."}
    rec, _ = _run(tmp_path / "run", ["solver.num_rollouts=3", "optim.micro_batch_size=3", "reward.citations=retrieved",
                                     "reward.source=rule", "reward.rule_quality=item_recall", f"reward.items_path={path}",
                                     "verifier.enabled=false", "evaluator.enabled=false", "evaluator.static_rubric=true",
                                     "harness.enabled=false"], lambda req: _solver(req, bodies))
    rw, m = rec.steps[0]["rewards"], rec.steps[0]["metrics"]
    assert rw.validity.tolist() == [1.0, 0.0, 0.0]
    assert rw.rewards.tolist() == pytest.approx([1.5, 0.0, 0.0])
    assert m["solver/reward_score_part"] == pytest.approx(0.5)


def test_item_recall_needs_items_for_every_training_query(tmp_path):
    from helpers import compose
    from score_lightning.data.items import EvidenceItem, QueryItems, items_lines
    from score_lightning.launch.config_validation import ConfigError, validate_config

    validate_config(compose(["experiment=rule_tiny", "reward.rule_quality=item_recall"]))  # the embedded items
    queries = tmp_path / "mine.jsonl"
    queries.write_text('{"id": "a", "prompt": "one"}\n{"id": "b", "prompt": "two"}\n')
    with pytest.raises(ConfigError, match="embedded items cover the embedded queries only"):
        validate_config(compose(["experiment=rule_tiny", "reward.rule_quality=item_recall",
                                 f"data.queries_path={queries}"]))
    items = tmp_path / "items.jsonl"
    items.write_text(items_lines([QueryItems("a", "one", [EvidenceItem("t", ("d",), ())])]))
    with pytest.raises(ConfigError, match=r"1 training queries have no items \(e.g. \['b'\]\)"):
        validate_config(compose(["experiment=rule_tiny", "reward.rule_quality=item_recall",
                                 f"data.queries_path={queries}", f"reward.items_path={items}"]))
