"""The evaluator's signal as registered plug-ins (issue 70): ``evaluator.reward`` and ``reward.step`` name entries of
``step/objectives.py``'s registries, so a variant is one registered entry, used by the real step without touching it.

One real step (scripted engine, real model, retriever, trainer and updates) under a reward and a step credit this
file registers: the reward's value is checked by hand, and the credit's hooks are seen at their lines of Algorithm 1.
Unknown names are refused at config time with the registered names.
"""

from __future__ import annotations

import math

import pytest

from helpers import FAST, compose
from score_lightning import distributed as D
from score_lightning.step.evaluator_objective import EvaluatorObjective
from score_lightning.step.evaluator_reward import EvaluatorReward, RewardInputs
from score_lightning.step.objectives import EVALUATOR_REWARDS, STEP_CREDIT
from test_score_step import StepRecords, scripted_run

VALID_SHARE, ORDER_PROBE = "valid_share_test", "order_probe_test"
CALLS: list[str] = []


def _valid_share(inputs: RewardInputs, scalars) -> float:
    """The share of valid reports (a(r) > 0) over every rank's reports."""
    total, count = D.global_sum(sum(bool(a.valid) for a in inputs.answers)), D.global_sum(len(inputs.answers))
    return total / count if count else math.nan


class OrderProbe(EvaluatorObjective):
    """A step credit that only notes when the step calls it, and logs one value."""

    def judge(self, step):
        CALLS.append("judge")
        return None

    def measure(self, step):
        CALLS.append("measure")
        return None

    def fold(self, trained, advantages):
        CALLS.append("fold")
        return trained, advantages

    def scalars(self) -> dict[str, float]:
        return {"test/order_probe": 1.0}


EVALUATOR_REWARDS.register(VALID_SHARE, EvaluatorReward(_valid_share))
STEP_CREDIT.register(ORDER_PROBE, lambda cfg: OrderProbe())


def test_a_registered_reward_and_step_credit_drive_a_real_step(tmp_path, tiny_ckpt, corpus_file):
    cfg = compose(FAST + [
        f"paths.output_dir={tmp_path}", "trainer.max_steps=1", "data.batch_size=2", "optim.mini_batch_size=2",
        "solver.num_rollouts=3", "optim.micro_batch_size=3", "solver.max_response_tokens=160",
        "evaluator.max_response_tokens=400", "evaluator.max_rubric_tokens=96", "reward.require_citation=true",
        "verifier.min_search_depth=1", "harness.every_n_steps=10", "optim.warmup_steps=0", "evaluator.scoring=joint",
        f"evaluator.reward={VALID_SHARE}", f"reward.step={ORDER_PROBE}"])
    records = StepRecords()

    def note_updates(module):
        module.pre_step_hook = lambda module, phase: CALLS.append(phase)

    CALLS.clear()
    scripted_run(cfg, [records], hook=note_updates)
    step = records.steps[-1]
    m, answers = step["metrics"], step["rewards"].answers
    # each query's third report cites nothing (a(r) = 0): 4 of the 6 reports are valid
    assert [bool(a.valid) for a in answers] == [True, True, False] * 2
    assert step["sample_rewards"] == [pytest.approx(4 / 6)]  # the step's one rubric earns the registered value
    assert m["evaluator/reward"] == pytest.approx(4 / 6)
    assert step["evaluator_advantage"] == pytest.approx(4 / 6)  # b_0 = 0
    assert m["evaluator/baseline"] == pytest.approx(0.3 * 4 / 6)  # b_1 = 0.7 * 0 + 0.3 * R
    assert m["evaluator/consistency"] == pytest.approx(0.5)  # still logged: query a's conclusions agree, b's do not
    assert m["evaluator/updated"] == 1.0  # the rubric trained on it
    # the credit is judged before the solver's update, measured and folded after it, before the evaluator's
    assert CALLS == ["judge", "solver", "measure", "fold", "evaluator"]
    assert m["test/order_probe"] == 1.0


def test_unknown_names_are_refused_with_the_registered_ones():
    from score_lightning.launch.config_validation import ConfigError, validate_config

    with pytest.raises(ConfigError) as refused:
        validate_config(compose(["experiment=tiny_score", "evaluator.reward=consistancy", "reward.step=steps"]))
    text = str(refused.value)
    assert ("evaluator.reward='consistancy': allowed one of the registered evaluator rewards: consistency, "
            f"discriminative, preference, solver_reward, {VALID_SHARE}") in text
    assert f"reward.step='steps': allowed one of the registered step credits: none, {ORDER_PROBE}, rubric, stage" in text
    with pytest.raises(KeyError, match=f"evaluator.reward='consistancy': no such entry .*{VALID_SHARE}"):
        EVALUATOR_REWARDS.get("consistancy")
