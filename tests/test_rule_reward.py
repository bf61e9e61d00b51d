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
