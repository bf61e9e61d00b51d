"""Who scores a step as registered plug-ins: ``reward.source`` and ``evaluator.source`` name entries of
``step/scoring_sources.py``'s registries, and reward terms are added after them, so a baseline that scores without
the evaluator role (the external judge, the rule reward) is a plug-in the generator never names.

One real step (scripted engine, real model, retriever, trainer and updates) under an evaluator source and a reward
term this file registers, with the rewards checked by hand; then the check that stops a step whose judgements failed,
driven by a registered source that says its scores come from the judge.
"""

from __future__ import annotations

import pytest
import torch

from helpers import FAST, compose
from score_lightning.clients.judge import JudgeTally
from score_lightning.errors import JudgeUnavailable
from score_lightning.step.reward_assembly import StepRewards
from score_lightning.step.scoring_sources import (
    EVALUATOR_SOURCES, REWARD_SOURCES, REWARD_TERMS, RewardTerm, ScoringSource, step_scorer,
)
from test_score_step import StepRecords, scripted_run

TRIPLE, FAILING, BONUS = "triple_validity_test", "failing_judge_test", "half_bonus_test"
SEEN: dict[str, object] = {}


def _triple_validity(gen, ro, answers) -> StepRewards:
    """R = 3 a(r), no scoring rollouts: the source sees the parsed answers and the generator's report groups."""
    reports, sources, _ = gen.report_groups(ro, answers)
    SEEN["reports"], SEEN["sources"] = reports, sources
    ro.scoring = []
    n, k = len(answers), gen.K
    validity = torch.tensor([float(a.valid) for a in answers])
    return StepRewards(answers=list(answers), validity=validity, item_scores=[torch.zeros(k, 0)] * (n // k),
                       rubric_part=torch.zeros(n), depth=torch.zeros(n, dtype=torch.long),
                       verified=torch.ones(n, dtype=torch.bool), process_ok=torch.ones(n, dtype=torch.bool),
                       eval_valid=[], rewards=3.0 * validity, tau=0, reports_valid=[False] * n,
                       complete=[True] * (n // k), judged=[True] * n)


def _failing_judge(gen, ro, answers) -> StepRewards:
    """The same rewards, with a tally in which 3 of 4 judgements failed."""
    rw = _triple_validity(gen, ro, answers)
    rw.judge = JudgeTally(endpoint="http://judge.test/v1", requests=4, failed=3, kinds={"timeout": 3})
    return rw


def _half_bonus(gen, ro, rw: StepRewards) -> StepRewards:
    rw.rewards = rw.rewards + 0.5 * rw.validity
    return rw


EVALUATOR_SOURCES.register(TRIPLE, ScoringSource(_triple_validity))
EVALUATOR_SOURCES.register(FAILING, ScoringSource(_failing_judge, calls_judge=True))
REWARD_TERMS.register(BONUS, RewardTerm(lambda cfg: cfg.evaluator.source == TRIPLE, _half_bonus))


def _step(tmp_path, source: str):
    cfg = compose(FAST + [
        f"paths.output_dir={tmp_path}", "trainer.max_steps=1", "data.batch_size=2", "optim.mini_batch_size=2",
        "solver.num_rollouts=3", "optim.micro_batch_size=3", "solver.max_response_tokens=160",
        "evaluator.max_rubric_tokens=96", "reward.require_citation=true", "verifier.enabled=false",
        "evaluator.scoring=pointwise", "harness.every_n_steps=10", "optim.warmup_steps=0",
        f"evaluator.source={source}", "judge.max_failed_rate=0.5"])
    records = StepRecords()
    scripted_run(cfg, [records])
    return records.steps[-1]


def test_a_registered_source_and_term_score_a_real_step(tmp_path, tiny_ckpt, corpus_file):
    SEEN.clear()
    step = _step(tmp_path, TRIPLE)
    rw, m = step["rewards"], step["metrics"]
    # each query's third report cites nothing (a(r) = 0): R = 3 a(r) from the source, + 0.5 a(r) from the term
    assert [bool(a.valid) for a in rw.answers] == [True, True, False] * 2
    assert rw.rewards.tolist() == pytest.approx([3.5, 3.5, 0.0] * 2)
    assert [[r is not None for r in group] for group in SEEN["reports"]] == [[True, True, True]] * 2
    sources = [ids for group in SEEN["sources"] for ids in group]  # query-major, as the answers
    assert all(set(a.cited_ids) <= set(ids) and ids for a, ids in zip(rw.answers, sources))  # what its search found
    assert not any(key.startswith("judge/") for key in m)  # the source does not call the judge: nothing counted


def test_a_source_that_calls_the_judge_stops_the_step_when_too_many_failed(tmp_path, tiny_ckpt, corpus_file):
    with pytest.raises(JudgeUnavailable, match=r"failed 75% of this step's judgements, above "
                                               r"judge.max_failed_rate=0.5: 3 of 4 judgements failed at "
                                               r"http://judge.test/v1: timeout x3"):
        _step(tmp_path, FAILING)


def test_the_core_sources_and_the_plugins_are_found_by_name():
    cfg = compose(["experiment=tiny_score"])
    assert step_scorer(cfg.reward, cfg.evaluator) is EVALUATOR_SOURCES.get("policy")
    judge = compose(["experiment=grpo_judge_tiny"])
    assert step_scorer(judge.reward, judge.evaluator).calls_judge  # methods/judge/
    rule = compose(["experiment=rule_tiny"])
    assert step_scorer(rule.reward, rule.evaluator) is REWARD_SOURCES.get("rule")  # methods/rule/
    assert {"citation_judge", BONUS} <= set(REWARD_TERMS.names())
