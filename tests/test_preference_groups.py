"""``evaluator.reward=preference`` with ``evaluator.preference.group_size`` G >= 2: the preference-trained rubric
generator's GRPO. Each training pair gets G rubrics written for its own question; each rubric's reward is whether it
ranks the pair right; advantages are group-normalised. Against hand computations, and in a real step (scripted
engine, real model and updates) whose evaluator update trains exactly those rubric samples."""

from __future__ import annotations

import json
import math

import pytest

from helpers import FAST, compose
from score_lightning.roles.rubric import Rubric
from score_lightning.methods.preference.reward import PreferenceReward
from score_lightning.methods.preference.groups import PreferenceGroups, group_advantages, preference_groups
from score_lightning.step.types import RubricSample

DIMS = ("factual_support", "evidence_coverage", "citation_grounding")
GOOD, BAD = "CHOSEN report: cited and complete.", "REJECTED report: thin."


def _rubric_xml(weights) -> str:
    return "<think>pick</think><dimensions>" + "".join(
        f'<dim name="{d}" weight="{w:.2f}"/>' for d, w in zip(DIMS, weights)) + "</dimensions>"


def _pairs(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_group_advantages_by_hand():
    # rewards 1, 0: mean 1/2, unbiased std sqrt(1/2)
    assert group_advantages([1.0, 0.0]) == pytest.approx([0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5)], abs=1e-5)
    # 1, 1/2, 1/2, 0: mean 1/2, std sqrt((1/4 + 1/4) / 3)
    s = math.sqrt(0.5 / 3)
    assert group_advantages([1.0, 0.5, 0.5, 0.0]) == pytest.approx([0.5 / s, 0, 0, -0.5 / s], abs=1e-5)
    assert group_advantages([0.5, 0.5, 0.5]) == [0.0] * 3 and group_advantages([1.0]) == [0.0]


def test_each_pair_gets_its_own_group_of_rubrics_scored_and_normalised(tmp_path):
    f = _pairs(tmp_path / "p.jsonl", [{"id": 1, "prompt": "q1", "chosen": "good", "rejected": "bad"},
                                      {"id": 2, "prompt": "q2", "chosen": "good", "rejected": "bad"},
                                      {"id": 3, "prompt": "held", "chosen": "good", "rejected": "bad", "split": "test"}])
    pref = PreferenceReward(f, pairs_per_step=2, group_size=3)
    assert [p["prompt"] for p in pref.pairs] == ["q1", "q2"]  # held-out pairs never train
    right, wrong = Rubric(DIMS, (0.5, 0.3, 0.2)), Rubric(DIMS, (0.2, 0.3, 0.5))
    asked = []

    def sample_for(question, n):
        asked.append((question, n))
        return [RubricSample(r, True, prompt_ids=[1], response_ids=[2], train_mask=[1]) for r in (right, wrong, right)]

    orders = []

    def score_pairs(prompts, reports, rubrics):  # the chosen report scores 9, 5, 1 and the rejected 1, 5, 9
        orders.extend(r[0] for r in reports)
        return [[[9, 5, 1], [1, 5, 9]] if r[0] == "good" else [[1, 5, 9], [9, 5, 1]] for r in reports]

    groups = preference_groups(pref, 0, sample_for, score_pairs)
    assert sorted(asked) == [("q1", 3), ("q2", 3)]  # a group per pair, written for that pair's question
    assert orders == ["good"] * 3 + ["bad"] * 3  # positions alternate from pair to pair
    # right ranks chosen higher (6.2 vs 3.8), wrong the other way: rewards 1, 0, 1 in both groups
    assert groups.rewards == [1.0, 0.0, 1.0] * 2
    a = group_advantages([1.0, 0.0, 1.0])
    assert groups.advantages == pytest.approx(a * 2) and groups.agreement == pytest.approx(2 / 3)
    rows, adv = groups.fold(["step"], [0.2])
    assert rows[0] == "step" and len(rows) == 7
    assert adv == pytest.approx([0.2 * 7] + [x * 7 / 6 for x in a * 2])  # each part keeps its mean


def test_group_size_is_refused_outside_score_rubrics(tmp_path):
    from score_lightning.launch.config_validation import ConfigError, validate_config

    f = _pairs(tmp_path / "p.jsonl", [{"id": 1, "prompt": "q1", "chosen": "a", "rejected": "b"}])
    base = ["experiment=tiny_score", "evaluator.reward=preference", f"evaluator.preferences_path={f}"]
    validate_config(compose(base))
    with pytest.raises(ConfigError, match="group_size=4 with rubric=EvolvingRubrics"):
        validate_config(compose([*base, "rubric=evolving"]))
    with pytest.raises(ConfigError, match="evaluator.preference.group_size=0"):
        validate_config(compose([*base, "evaluator.preference.group_size=0"]))
    _pairs(tmp_path / "p.jsonl", [{"id": 1, "prompt": "q1", "chosen": "a", "rejected": "b", "split": "dev"}])
    with pytest.raises(ConfigError, match='"split" must be one of'):
        validate_config(compose(base))


def _respond(req):
    if req.role == "rubric":  # two rubrics per pair: the first ranks the pair right, the second wrong
        return _rubric_xml((0.5, 0.3, 0.2) if req.index % 2 == 0 else (0.2, 0.3, 0.5))
    if req.role == "solver":
        return "<answer>A report without sources. Conclusion: none.</answer>"
    values = (9, 5, 1) if "CHOSEN" in req.context.rsplit("Report 1", 1)[-1] else (1, 5, 9)
    scores = "".join(f'<score dim="{d}" value="{v}" reason="r"/>' for d, v in zip(DIMS, values))
    return (f'<report_evaluations><report id="1"><verification>checked</verification><scores>{scores}</scores>'
            '</report></report_evaluations>')


def test_a_step_trains_the_pair_rubrics_by_grpo(tmp_path, tiny_ckpt, corpus_file):
    import lightning as L
    import torch

    from score_lightning.launch.training import run
    from score_lightning.rollout.scripted import ScriptedEngine
    from score_lightning.step.batching import build_token_batch, policy_logprobs

    question = "Which standard module parses command-line options?"
    f = _pairs(tmp_path / "p.jsonl", [{"id": 1, "prompt": question, "chosen": GOOD, "rejected": BAD}])
    cfg = compose(FAST + [f"paths.output_dir={tmp_path / 'run'}", "trainer.max_steps=1", "optim.warmup_steps=0",
                          "harness.every_n_steps=10", "verifier.enabled=false", "evaluator.max_rubric_tokens=96",
                          "evaluator.max_response_tokens=200", "evaluator.reward=preference",
                          f"evaluator.preferences_path={f}", "evaluator.preference.pairs_per_step=1",
                          "evaluator.preference.group_size=2"])
    seen, prompts = {}, []

    def hook(module, phase):
        if phase == "evaluator":  # after the backward, before the step: the weights the update's forward saw
            rows = seen.setdefault("rows", [])
            seen["lp"] = None if not rows else sum(_lp(module, r) for r in rows)

    def _lp(module, row):
        batch = build_token_batch([row.prompt_ids], [row.response_ids], [row.train_mask], module.tokenizer.pad_token_id)
        with torch.no_grad():
            lp, _ = policy_logprobs(module.policy, batch, float(module.cfg.evaluator.temperature))
        return float((lp * batch.loss_mask).sum())

    class Keep(L.Callback):
        def on_train_batch_end(self, trainer, module, *args):
            seen["step"] = module.last_step

    def install(module):
        engine = ScriptedEngine(module.tokenizer, lambda req: prompts.append(req) or _respond(req))
        module.engine = module.evaluator_engine = engine
        objective = module.objectives[-1]  # evaluator.reward=preference's own, after the step credit and scoring
        original = objective.rubric_groups

        def recorded(step):
            groups = original(step)
            seen["groups"], seen["rows"] = groups, [s for s in groups.samples if s.sampled]
            return groups

        objective.rubric_groups = recorded
        module.pre_step_hook = hook

    run(cfg, extra_callbacks=[Keep()], module_hook=install)
    groups, m = seen["groups"], seen["step"]["metrics"]
    assert groups.rewards == [1.0, 0.0]
    assert groups.advantages == pytest.approx(group_advantages([1.0, 0.0]))
    pair_prompts = [r.prompt for r in prompts if r.role == "rubric" and question in r.prompt]
    assert len(pair_prompts) == 2  # the pair's two rubrics were written for its own question
    assert m["evaluator/reward"] == pytest.approx(0.5)  # logged: the step's mean agreement
    # the update's rows are the pair rubrics alone (the step's own rubric is not trained by the preference reward)
    assert m["evaluator/rubric_logprob"] == pytest.approx(seen["lp"], rel=1e-4)
    assert isinstance(groups, PreferenceGroups)
