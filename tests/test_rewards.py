"""Reward arithmetic against numbers worked out by hand, and the metrics' reduction semantics."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from sklearn.feature_extraction.text import TfidfVectorizer
from torchmetrics.utilities.data import dim_zero_sum

from score_lightning.rewards.functions import (
    EMABaseline,
    apply_verifier,
    consistency_over_valid,
    group_consistency,
    pairwise_tfidf_consistency,
    solver_reward,
    verified_rewards,
)
from score_lightning.rewards.citations import citation_precision
from score_lightning.rewards.metrics import CitationValidity, Consistency, RubricReward

T = torch.tensor

# Rubric A: weights (0.4, 0.3, 0.3). Four reports:
#   r1 valid,   s=(0.7, 0.5, 1.0): 0.28 + 0.15 + 0.30 = 0.73 -> R = 1.73
#   r2 invalid, s=(0.2, 0.0, 0.6):                           -> R = 0
#   r3 valid,   s=(1, 1, 1):       1.0                        -> R = 2.0
#   r4 valid,   s=(0, 0, 0):       0.0                        -> R = 1.0
W_A = T([0.4, 0.3, 0.3])
S_A = T([[0.7, 0.5, 1.0], [0.2, 0.0, 0.6], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
V_A = T([1.0, 0.0, 1.0, 1.0])


def test_solver_reward_rubric_a_by_hand():
    r = solver_reward(V_A, S_A, W_A.expand(4, 3))
    assert r.tolist() == pytest.approx([1.73, 0.0, 2.0, 1.0])
    # a [k] weight vector broadcasts to the same numbers
    assert solver_reward(V_A, S_A, W_A).tolist() == pytest.approx([1.73, 0.0, 2.0, 1.0])


def test_solver_reward_equal_weights_and_fractional_validity():
    # Rubric B: 4 dims at 0.25; s=(0.8,0.4,0.6,0.2): sum 2.0 * 0.25 = 0.5; a = 0.5 -> 0.5 * 1.5 = 0.75
    r = solver_reward(T([0.5]), T([[0.8, 0.4, 0.6, 0.2]]), T([[0.25] * 4]))
    assert r.tolist() == pytest.approx([0.75])


def test_solver_reward_per_row_rubrics():
    # same scores (0.6, 0.2) under two rubrics:
    #   (0.5, 0.5): 0.3 + 0.1 = 0.4 -> 1.4;   (0.1, 0.9): 0.06 + 0.18 = 0.24 -> 1.24
    r = solver_reward(T([1.0, 1.0]), T([[0.6, 0.2], [0.6, 0.2]]), T([[0.5, 0.5], [0.1, 0.9]]))
    assert r.tolist() == pytest.approx([1.4, 1.24])


def test_solver_reward_shape_errors():
    with pytest.raises(ValueError):
        solver_reward(T([1.0, 1.0]), S_A, W_A)
    with pytest.raises(ValueError):
        solver_reward(V_A, S_A, T([0.5, 0.5]))


def test_verifier_zeroes_rows_below_tau():
    scores = T([[0.7, 0.5, 1.0], [0.2, 0.0, 0.6], [1.0, 1.0, 1.0], [0.9, 0.9, 0.9]])
    depth = T([2, 0, 1, 3])
    out, verified = apply_verifier(scores, depth, min_depth=2)
    assert verified.tolist() == [True, False, False, True]
    assert torch.allclose(out, T([[0.7, 0.5, 1.0], [0, 0, 0], [0, 0, 0], [0.9, 0.9, 0.9]]))
    assert scores[1].tolist() == pytest.approx([0.2, 0.0, 0.6])  # input untouched
    # rewards: r1 1.73; r2, r3 zeroed -> 1.0; r4 1 + 0.9 = 1.9
    r = solver_reward(torch.ones(4), out, W_A)
    assert r.tolist() == pytest.approx([1.73, 1.0, 1.0, 1.9])

    # ablation: disabled verifier leaves scores, still reports depth >= tau
    out2, verified2 = apply_verifier(scores, depth, min_depth=2, enabled=False)
    assert torch.equal(out2, scores) and verified2.tolist() == [True, False, False, True]
    # r2: 1 + 0.08 + 0 + 0.18 = 1.26; r3: 2.0
    assert solver_reward(torch.ones(4), out2, W_A).tolist() == pytest.approx([1.73, 1.26, 2.0, 1.9])

    # tau = 0 verifies everything
    out3, verified3 = apply_verifier(scores, depth, min_depth=0)
    assert verified3.all() and torch.equal(out3, scores)


def test_verified_rewards_zero_reward_vs_scores_by_hand():
    """Algorithm 1, line 23 (zero="reward") against the softer zero="scores" on rubric A."""
    depth = T([2, 0, 1, 3])
    r, s, verified = verified_rewards(V_A, S_A, W_A, depth, min_depth=2)
    # r1 1.73 verified; r2 invalid 0; r3 depth 1 < 2: reward 2.0 -> 0; r4 1.0 verified
    assert r.tolist() == pytest.approx([1.73, 0.0, 0.0, 1.0])
    assert torch.equal(s, S_A) and verified.tolist() == [True, False, False, True]
    r2, s2, _ = verified_rewards(V_A, S_A, W_A, depth, min_depth=2, zero="scores")
    assert r2.tolist() == pytest.approx([1.73, 0.0, 1.0, 1.0])  # r3 keeps a(r) = 1
    assert s2[2].tolist() == [0.0, 0.0, 0.0] and s2[0].tolist() == pytest.approx([0.7, 0.5, 1.0])
    r3, _, _ = verified_rewards(V_A, S_A, W_A, depth, min_depth=2, enabled=False)
    assert r3.tolist() == pytest.approx([1.73, 0.0, 2.0, 1.0])  # "no verifier" ablation
    with pytest.raises(ValueError, match="verifier.zero"):
        verified_rewards(V_A, S_A, W_A, depth, 2, zero="all")


def test_consistency_over_valid_reports_only():
    # the invalid report's conclusion would pull C down from 1.0 to 1/3 if it counted
    assert consistency_over_valid(["use json", "use json", "other words"], [True, True, False]) == pytest.approx(1.0)
    assert consistency_over_valid(["use json", "use json", "other words"], [True, True, True]) == pytest.approx(1 / 3)
    assert consistency_over_valid(["use json", "x"], [True, False]) is None  # one valid report: no pair
    assert consistency_over_valid([], []) is None


def test_verifier_shape_error():
    with pytest.raises(ValueError):
        apply_verifier(torch.zeros(3, 2), torch.zeros(2), 1)


# ----------------------------------------------------------------------------- consistency


def _idf(n_docs: int, df: int) -> float:
    """scikit-learn's default smoothed idf: ln((1 + n) / (1 + df)) + 1."""
    return math.log((1 + n_docs) / (1 + df)) + 1


def test_consistency_hand_cases():
    assert pairwise_tfidf_consistency(["use json dumps", "use json dumps"]) == pytest.approx(1.0)
    assert pairwise_tfidf_consistency(["alpha beta", "gamma delta"]) == pytest.approx(0.0)
    # "cat dog" vs "cat fish", n=2: idf(cat)=1, idf(dog)=idf(fish)=ln(3/2)+1; only cat overlaps
    c, d = _idf(2, 2), _idf(2, 1)
    assert pairwise_tfidf_consistency(["cat dog", "cat fish"]) == pytest.approx(c * c / (c * c + d * d))
    # K=3 with "bird" added: idfs change (n=3); pairs with "bird" are 0, so C = cos12 / 3
    c, d = _idf(3, 2), _idf(3, 1)
    assert pairwise_tfidf_consistency(["cat dog", "cat fish", "bird"]) == pytest.approx(c * c / (c * c + d * d) / 3)


def test_consistency_degenerate_inputs():
    assert pairwise_tfidf_consistency(["", "", ""]) == 0.0  # empty vocabulary
    assert pairwise_tfidf_consistency(["a", "!"]) == 0.0  # single chars are not tokens either
    assert pairwise_tfidf_consistency(["same words", "same words", ""]) == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        pairwise_tfidf_consistency(["only one"])


def _direct_sklearn(texts: list[str]) -> float:
    x = TfidfVectorizer().fit_transform(texts).toarray()
    norms = np.linalg.norm(x, axis=1)
    sims = [
        float(x[a] @ x[b] / (norms[a] * norms[b])) if norms[a] and norms[b] else 0.0
        for a, b in itertools.combinations(range(len(texts)), 2)
    ]
    return sum(sims) / len(sims)


def test_consistency_matches_direct_sklearn():
    rng = np.random.default_rng(0)
    vocab = "json dumps loads file path open read write encoder decoder stream buffer".split()
    for k in (2, 3, 5, 8):
        texts = [" ".join(rng.choice(vocab, size=rng.integers(2, 9))) for _ in range(k)]
        assert pairwise_tfidf_consistency(texts) == pytest.approx(_direct_sklearn(texts), abs=1e-12)


def test_group_consistency():
    per_query, r_eval = group_consistency([["same words here", "same words here"], ["alpha beta", "gamma delta"]])
    assert per_query == pytest.approx([1.0, 0.0]) and r_eval == pytest.approx(0.5)
    with pytest.raises(ValueError):
        group_consistency([])


# ----------------------------------------------------------------------------- EMA baseline


def test_ema_baseline_five_steps_by_hand():
    # beta 0.7, b0 0:  A_t = R_t - b_{t-1};  b_t = 0.7 b_{t-1} + 0.3 R_t
    #   R=0.5: A=0.5,     b=0.15
    #   R=0.2: A=0.05,    b=0.105 + 0.06   = 0.165
    #   R=0.8: A=0.635,   b=0.1155 + 0.24  = 0.3555
    #   R=0.4: A=0.0445,  b=0.24885 + 0.12 = 0.36885
    #   R=0.6: A=0.23115, b=0.258195 + 0.18 = 0.438195
    ema = EMABaseline(beta=0.7)
    expected = [(0.5, 0.15), (0.05, 0.165), (0.635, 0.3555), (0.0445, 0.36885), (0.23115, 0.438195)]
    for r, (adv, b) in zip([0.5, 0.2, 0.8, 0.4, 0.6], expected):
        got_adv, got_b = ema.update(r)
        assert got_adv == pytest.approx(adv) and got_b == pytest.approx(b)
    assert ema.steps == 5


def test_ema_state_roundtrip_and_validation():
    a = EMABaseline(0.7)
    a.update(0.5)
    b = EMABaseline(0.9)
    b.load_state_dict(a.state_dict())
    assert b.beta == 0.7 and b.value == pytest.approx(0.15) and b.steps == 1
    assert b.update(0.2) == pytest.approx(a.update(0.2))
    for beta in (1.0, -0.1, 1.5):
        with pytest.raises(ValueError):
            EMABaseline(beta)
    with pytest.raises(ValueError):
        EMABaseline(0.7).update(float("nan"))
    assert EMABaseline(0.0).update(0.4) == pytest.approx((0.4, 0.4))  # beta 0: b follows R


def test_citation_precision():
    assert citation_precision(["a", "b", "c"], ["a", "c", "x"]) == pytest.approx(2 / 3)
    assert citation_precision(["a", "a", "b"], ["a"]) == pytest.approx(0.5)  # distinct ids
    assert citation_precision([], ["a"]) is None
    assert citation_precision(["z"], []) == 0.0


# ----------------------------------------------------------------------------- metrics


def test_rubric_reward_metric_pools_not_mean_of_means():
    a, b = RubricReward(), RubricReward()
    a.update(V_A[:3], S_A[:3], W_A)  # 1.73 + 0 + 2.0 = 3.73 over 3
    b.update(V_A[3:], S_A[3:], W_A)  # 1.0 over 1
    assert float(a.total) == pytest.approx(3.73) and int(a.count) == 3
    merged = b  # merge a's sums into b, as the "sum" reduction does across ranks
    merged.merge_state(a)
    assert int(merged.count) == 4
    assert float(merged.compute()) == pytest.approx(4.73 / 4)  # 1.1825, not (3.73/3 + 1)/2 = 1.1217
    for m in (a, b, merged):
        assert m._reductions["total"] is dim_zero_sum and m._reductions["count"] is dim_zero_sum


def test_rubric_reward_metric_with_verifier():
    m = RubricReward()
    m.update(torch.ones(4), S_A, W_A, depth=T([2, 0, 2, 2]), min_depth=1)  # r2's reward zeroed: 1.73 + 0 + 2 + 1
    assert float(m.compute()) == pytest.approx(4.73 / 4)
    m = RubricReward()
    m.update(torch.ones(4), S_A, W_A, depth=T([2, 0, 2, 2]), min_depth=1, zero="scores")  # r2 keeps a(r)=1
    assert float(m.compute()) == pytest.approx(5.73 / 4)
    with pytest.warns(UserWarning, match="before the ``update``"):
        assert math.isnan(float(RubricReward().compute()))  # empty -> NaN: nothing measured, not a 0


def test_consistency_metric_pools_queries():
    a, b = Consistency(), Consistency()
    a.update([["same words", "same words"], ["alpha beta", "gamma delta"], ["same words", "same words"]])
    b.update([["alpha beta", "gamma delta"]])
    merged = b
    merged.merge_state(a)
    assert float(merged.compute()) == pytest.approx(2 / 4)  # not (2/3 + 0)/2


def test_citation_validity_metric_skips_uncited():
    a, b = CitationValidity(), CitationValidity()
    a.update([(["a", "b"], ["a"]), ([], ["a"]), (["c"], ["c"])])  # 0.5, skipped, 1.0
    b.update([(["d"], [])])  # 0.0
    merged = b
    merged.merge_state(a)
    assert int(merged.count) == 3 and float(merged.compute()) == pytest.approx(1.5 / 3)
