"""RubricEM's pieces, against hand computations: the stage spans, the stage-score parser and Stage-Structured GRPO's
per-stage advantages and token bonuses."""

from __future__ import annotations

import dataclasses
import math

import pytest

from score_lightning.methods.rubricem.prompts import parse_stage_scores, rubricem_messages, stage_judge_messages
from score_lightning.methods.rubricem.stages import stage_spans
from score_lightning.methods.rubricem.credit import stage_advantages, stage_bonuses


def test_stage_scores_parse_every_stage_or_nothing():
    assert parse_stage_scores('x <stage_scores plan="7" research="5" review="10" answer="0"/>') == {
        "plan": 0.7, "research": 0.5, "review": 1.0, "answer": 0.0}
    assert parse_stage_scores('<stage_scores plan="7" research="5" review="6"/>') is None  # answer missing
    assert parse_stage_scores('<stage_scores plan="11" research="5" review="6" answer="1"/>') is None
    assert parse_stage_scores('<stage_scores plan="x" research="5" review="6" answer="1"/>') is None
    assert parse_stage_scores(None) is None


def test_stage_spans_by_hand(tokenizer):
    parts = ['<plan><rubric_items><item weight="1">names it</item></rubric_items></plan>', "<search>json</search>",
             "\n<observation>[a] text</observation>\n", "<review>found [a]</review>", "<answer>It is [a].</answer>"]
    ids, bounds = [], []
    for p in parts:
        bounds.append(len(ids))
        ids.extend(tokenizer(p, add_special_tokens=False)["input_ids"])
    spans = stage_spans(ids, tokenizer.decode)
    # each part was tokenised alone, so the stages start exactly where their parts do
    assert spans == {"plan": (0, bounds[1]), "research": (bounds[1], bounds[3]), "review": (bounds[3], bounds[4]),
                     "answer": (bounds[4], len(ids))}
    no_review = ids[:bounds[3]] + ids[bounds[4]:]
    assert stage_spans(no_review, tokenizer.decode) == {"plan": (0, bounds[1]), "research": (bounds[1], bounds[3]),
                                                        "answer": (bounds[3], len(no_review))}
    assert stage_spans(tokenizer("<answer>x</answer>", add_special_tokens=False)["input_ids"], tokenizer.decode) == {
        "answer": (0, len(tokenizer("<answer>x</answer>", add_special_tokens=False)["input_ids"]))}


def test_stage_advantages_normalise_each_stage_within_its_group_by_hand():
    s = [{"plan": 0.2, "research": 0.5, "review": 0.4, "answer": 0.9},
         {"plan": 0.6, "research": 0.5, "review": 0.8, "answer": 0.1},
         None,  # an invalid judgement: no stage score
         {"plan": 0.4, "research": 0.5, "review": 0.6, "answer": 0.5}]
    adv = stage_advantages(s, k=4, eps=0.0)
    # plan: 0.2, 0.6, 0.4 -> mean 0.4, unbiased std 0.2 -> -1, +1, 0
    assert [round(a["plan"], 9) for a in adv] == [-1.0, 1.0, 0.0, 0.0]
    assert all(a["research"] == 0.0 for a in adv)  # all equal: no signal
    # answer: 0.9, 0.1, 0.5 -> mean 0.5, std 0.4 -> +1, -1, 0
    assert [round(a["answer"], 9) for a in adv] == [1.0, -1.0, 0.0, 0.0]
    assert adv[2] == {"plan": 0.0, "research": 0.0, "review": 0.0, "answer": 0.0}
    # two groups of two never mix
    two = stage_advantages([{"plan": 0.0, "research": 0, "review": 0, "answer": 0},
                            {"plan": 1.0, "research": 0, "review": 0, "answer": 0},
                            {"plan": 0.5, "research": 0, "review": 0, "answer": 0}, None], k=2, eps=0.0)
    # group 1: 0 and 1 -> mean 0.5, unbiased std sqrt(0.5) -> -/+ 0.7071; group 2: one score -> 0
    assert [a["plan"] for a in two] == pytest.approx([-0.5 / math.sqrt(0.5), 0.5 / math.sqrt(0.5), 0.0, 0.0])


def test_stage_bonuses_put_lambda_times_the_stage_advantage_on_its_tokens():
    spans = {"plan": (0, 5), "research": (5, 9), "answer": (12, 20)}
    got = stage_bonuses(spans, {"plan": 1.0, "research": 0.0, "review": 2.0, "answer": -0.5}, lam=0.5)
    assert [(b.start, b.end, b.value) for b in got] == [(0, 5, 0.5), (12, 20, -0.25)]  # research 0; review has no span


def test_prompts_carry_the_stages_and_the_guidance():
    from score_lightning.harness.state import HarnessState
    from score_lightning.roles.rubric import Rubric

    m = rubricem_messages("How?", Rubric(("clarity",), (1.0,)), HarnessState(), 3, guidance="Cite two documents.")
    assert "<plan>" in m[0]["content"] and "at most 3 searches" in m[0]["content"]
    assert m[1]["content"].endswith("Guidance from earlier attempts:\nCite two documents.")
    j = stage_judge_messages("How?", "<plan>x</plan>", ["q1"], "ok", "It is.")
    assert "[Research: searches]\n- q1" in j[1]["content"]


def test_rubricem_tiny_trains_two_steps_with_stage_credit(tmp_path, tiny_ckpt):
    from helpers import FAST, read_scalars, train

    out = tmp_path / "em"
    fast = [a.replace("experiment=tiny_score", "experiment=rubricem_tiny") for a in FAST]
    train([*fast, "rollout=scripted", "solver.num_rollouts=3", "trainer.max_steps=2", "solver.max_response_tokens=300",
           "evaluator.max_response_tokens=500", f"paths.output_dir={out}"])
    s = read_scalars(out / "tensorboard")
    for stage in ("plan", "research", "review", "answer"):
        assert [v for _, v in s[f"stage/{stage}_present"]] == [1.0, 1.0], stage
    assert [v for _, v in s["stage/judge_valid_rate"]] == [1.0, 1.0]
    # the scripted group's answers differ in citations (k % 3), so the answer stage has a spread and a score < 1
    assert 0.0 < s["stage/answer_score"][0][1] < 1.0
    assert [v for _, v in s["stage/memory_size"]] == [1.0, 2.0]  # FAST: one query a step, each remembered
    assert all(v > 0 for _, v in s["solver/reward_mean"])


def test_a_rubricem_run_is_carded_with_its_own_four_stage_prompt(tokenizer):
    """evaluate.py reads solver.agent=rubricem from the run's config and prompts held-out queries with the four
    stages (no guidance: a held-out query was never judged); a ReAct run's settings and prompt are unchanged."""
    from score_lightning.evaluation.generate import solver_workflow
    from score_lightning.evaluation.generate_config import GenerateConfig
    from score_lightning.evaluation.settings import evaluation_subset, resolve_settings
    from score_lightning.harness.state import HarnessState
    from score_lightning.roles.rubric import fallback_rubric
    from score_lightning.rollout.agent import AgentConfig
    from score_lightning.rollout.scripted import ScriptedEngine
    from score_lightning.rollout.workflows import SolverLoop

    s, origin = resolve_settings({}, evaluation_subset({"solver": {"agent": "rubricem", "max_tool_calls": 2}}), 8)
    assert s["solver.agent"] == "rubricem" and origin["solver.agent"] == "run"
    react, _ = resolve_settings({}, evaluation_subset({"solver": {"agent": "react"}}), 8)
    assert "solver.agent" not in react
    state = HarnessState()

    def first_prompt(cfg: GenerateConfig) -> str:  # the prompt generate's workflow sends for one held-out query
        engine, workflow = ScriptedEngine(tokenizer, lambda req: "<answer>It is.</answer>"), solver_workflow(cfg)
        workflow.rollouts(engine, tokenizer, None, ["How?"], [fallback_rubric(state)], state,
                          SolverLoop(1, None, AgentConfig(max_tool_calls=2)), workflow.options_from_settings(
                              cfg.settings()), None, [{}])
        return engine.requests[0].prompt

    em = first_prompt(GenerateConfig(model="m", queries="q", out="o", agent="rubricem", max_tool_calls=2))
    assert "<plan>" in em and "Guidance" not in em
    assert "<plan>" not in first_prompt(GenerateConfig(model="m", queries="q", out="o", max_tool_calls=2))
    assert GenerateConfig(model="m", queries="q", out="o", agent="rubricem").settings()["solver.agent"] == "rubricem"


def test_stage_credit_and_reflection_are_refused_where_they_cannot_apply():
    from helpers import compose
    from score_lightning.launch.config_validation import validate_config

    with pytest.raises(Exception, match="reward.step=stage with solver.agent='react'"):
        validate_config(compose(["experiment=tiny_score", "reward.step=stage"]))
    with pytest.raises(Exception, match="solver.rubricem.reflection=true needs reward.step=stage"):
        validate_config(compose(["experiment=rubricem_tiny", "reward.step=none"]))
    with pytest.raises(Exception, match="solver.rubricem.reflection=true needs"):
        validate_config(compose(["experiment=rubricem_tiny", "rollout.mode=async"]))
    validate_config(compose(["experiment=rubricem_tiny"]))  # the recipe itself passes


def test_the_reflection_memory_resumes_and_writes_the_best_plan_and_the_weakest_stage():
    import json

    from score_lightning.methods.rubricem.credit import StageCreditSettings, StageCreditStage, reflection

    texts = ["<plan>A</plan><answer>x</answer>", "<plan>B</plan><answer>y</answer>", "<answer>z</answer>"]
    scores = [{"plan": 0.5, "research": 0.2, "review": 0.6, "answer": 0.9},
              {"plan": 0.7, "research": 0.4, "review": 0.2, "answer": 0.5}, None]
    # the best reward (the third) wrote no plan: the next best's plan; research averages 0.3, the lowest
    assert reflection(texts, scores, [0.4, 0.2, 0.9], 400) == \
        "A plan that earned the best reward: A Weakest stage last time: research."
    assert reflection(["<answer>z</answer>"], [None], [1.0], 400) == ""
    on = StageCreditSettings(0.5, 96, 0.8, 1024, 1e-6, reflection=True, max_guidance_chars=400)
    stage = StageCreditStage(on)
    stage.memory = {"q1": "guidance"}
    copy = StageCreditStage(on)
    copy.load_state_dict(json.loads(json.dumps(stage.state_dict())))
    assert copy.memory == {"q1": "guidance"} and copy.guidance(["q1", "q2"]) == ["guidance", ""]
    off = dataclasses.replace(on, reflection=False)
    assert StageCreditStage(off).guidance(["q1"]) is None  # off: no guidance at all
