"""The scoring probe's maths (``score_lightning.rewards.score_signal``) against hand computations."""

from __future__ import annotations

import numpy as np
import pytest

from score_lightning.rewards.score_signal import group_taus, score_gap, within_group_tau


def _arrays(groups: list[list[tuple[float, float, bool]]]):
    """Per-report ``score, quality, valid, group`` arrays from ``[(score, q, valid), ...]`` per group."""
    rows = [(s, q, v, g) for g, reports in enumerate(groups) for s, q, v in reports]
    return tuple(np.array([r[i] for r in rows]) for i in range(4))


GROUPS = [
    [(0.1, 0.0, True), (0.5, 0.5, True), (0.9, 1.0, True), (0.95, 0.0, False)],  # q's order: tau 1 (invalid ignored)
    [(0.9, 0.0, True), (0.5, 0.5, True), (0.1, 1.0, True)],  # reversed: -1
    [(0.2, 0.0, True), (0.2, 1.0, True), (0.8, 1.0, True)],  # a tie in each: C=1, D=0, (3-1)(3-1) -> 1/2
    [(1.0, 0.0, True), (2.0, 0.5, True), (3.0, 0.25, True), (4.0, 1.0, True)],  # C=5, D=1 of 6 -> 2/3
    [(0.3, 0.5, True), (0.9, 0.0, False)],  # one valid report: excluded, counted as few
    [(0.3, 0.5, True), (0.7, 0.5, True)],  # q all tied: tau-b undefined, counted as tied
    [(0.4, 0.0, True), (0.4, 1.0, True)],  # scores all tied: counted as tied
    [(0.4, 0.0, False), (0.8, 1.0, False)],  # no valid report: few
]


def test_group_taus_by_hand():
    taus, few, tied = group_taus(*_arrays(GROUPS))
    assert taus == pytest.approx({0: 1.0, 1: -1.0, 2: 0.5, 3: 2 / 3})
    assert (few, tied) == (2, 2)


def test_within_group_tau_mean_interval_and_counts():
    r = within_group_tau(*_arrays(GROUPS))
    assert r.tau == pytest.approx((1.0 - 1.0 + 0.5 + 2 / 3) / 4)
    assert (r.groups, r.few, r.tied, r.excluded) == (4, 2, 2, 4)
    assert -1.0 <= r.lo <= r.tau <= r.hi <= 1.0 and r.lo < r.hi
    assert within_group_tau(*_arrays(GROUPS), seed=0) == r  # a fixed seed: the same interval every time
    agree = within_group_tau(*_arrays([GROUPS[0], GROUPS[0]]))
    assert (agree.tau, agree.lo, agree.hi, agree.groups) == (1.0, 1.0, 1.0, 2)  # every resample is 1
    none = within_group_tau(*_arrays(GROUPS[4:]))
    assert np.isnan(none.tau) and np.isnan(none.lo) and (none.groups, none.few, none.tied) == (0, 2, 2)


def test_score_gap_by_hand():
    """Valid 0.8, 0.6 vs invalid 0.2, 0.4: gap 0.4; resampling groups keeps it between the groups' own gaps."""
    score = np.array([0.8, 0.2, 0.6, 0.4])
    side = np.array([True, False, True, False])
    group = np.array([0, 0, 1, 1])  # group gaps 0.6 and 0.2
    gap, lo, hi = score_gap(score, side, group, np.random.default_rng(0))
    assert gap == pytest.approx(0.4) and 0.2 - 1e-12 <= lo <= gap <= hi <= 0.6 + 1e-12
    assert all(np.isnan(score_gap(score, np.ones(4, bool), group, np.random.default_rng(0))))


def test_the_step_logs_the_within_group_ranking_by_hand():
    """evaluator/rank_tau_valid: group 1's valid reports are scored in q's order (tau 1), group 2's in reverse
    (tau -1), group 3 has one valid report (left out): the pooled mean is 0 over two groups."""
    from types import SimpleNamespace

    import torch

    from score_lightning.step.record import record_ranking
    from score_lightning.step.scalars import StepScalars

    retrieved = ["a", "b", "c", "d"]
    cites = [["a"], ["a", "b"], ["a", "b", "c"], ["a"], ["a", "b"], ["a", "b", "c"], ["a"], ["a", "b"], []]
    answers = [SimpleNamespace(cited_ids=tuple(c)) for c in cites]
    rw = SimpleNamespace(answers=answers, validity=torch.tensor([1.0] * 6 + [1.0, 0.0, 0.0]),
                         reports_valid=[True] * 9, rubric_part=torch.tensor([0.1, 0.2, 0.3, 0.9, 0.5, 0.1, 0.4, 0.8, 0.1]))
    ro = SimpleNamespace(evidence=[], solver=[SimpleNamespace(retrieved_ids=retrieved)] * 9)
    sc = StepScalars(torch.device("cpu"))
    record_ranking(sc, ro, rw, 3, "retrieved_cited")
    assert sc.compute()["evaluator/rank_tau_valid"] == pytest.approx(0.0)
    rw.rubric_part = torch.tensor([0.1, 0.2, 0.3, 0.1, 0.5, 0.9, 0.4, 0.8, 0.1])  # both in q's order
    sc = StepScalars(torch.device("cpu"))
    record_ranking(sc, ro, rw, 3, "retrieved_cited")
    assert sc.compute()["evaluator/rank_tau_valid"] == pytest.approx(1.0)
