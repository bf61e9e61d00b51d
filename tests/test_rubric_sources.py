"""Rubric sources (score, evolving/RLER, given) and evaluator rewards, against hand computations."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from helpers import FAST, ROOT, compose, read_scalars, train
from score_lightning.harness.scheduler import DimensionScheduler
from score_lightning.harness.state import HarnessState
from score_lightning.retrieval.base import SearchHit
from score_lightning.roles.rubric import Rubric
from score_lightning.rollout.scripted import ProtocolResponder, ScriptedEngine
from score_lightning.step.rubric_source import RubricContext
from score_lightning.methods.rler.evolving import EvolvingRubrics
from score_lightning.methods.given.rubrics import load_given_rubrics
from score_lightning.methods.rler.items import items_rubric, parse_items
from score_lightning.methods.preference.reward import PreferenceReward


class OneHit:
    def search(self, queries, topk):
        return [[SearchHit("doc.a", '"doc.a"\npassage about a', 1.0)] for _ in queries]


def _ctx(tokenizer) -> RubricContext:
    state = HarnessState()
    return RubricContext(ScriptedEngine(tokenizer, ProtocolResponder()), tokenizer, OneHit(), state,
                         DimensionScheduler(list(state.dimension_pool)), 1024, 0.8)


# ----------------------------------------------------------------------------- items
def test_items_parse_and_rubric_weights_by_hand():
    p = parse_items('x<rubric_items><item weight="2">cites docs</item><item weight="1" sign="-">invents</item>'
                    '<item weight="0">ignored</item><item>no weight</item><item weight="1">names it</item></rubric_items>')
    assert [(i.text, i.weight, i.negative) for i in p.items] == [("cites docs", 2.0, False), ("invents", 1.0, True),
                                                                ("names it", 1.0, False)]
    r = items_rubric(p.items)  # weights over the positive total 3: 2/3, -1/3, 1/3
    assert r.dims == ("i1", "i2", "i3") and r.weights == pytest.approx((2 / 3, -1 / 3, 1 / 3))
    assert parse_items("<rubric_items></rubric_items>").error and parse_items("no block").error


# ----------------------------------------------------------------------------- RLER buffer
def test_rler_init_contrast_prune_and_exact_resume(tokenizer):
    ctx = _ctx(tokenizer)
    src = EvolvingRubrics(max_items=2, init_items=3, new_items=2)
    step = src.step_rubrics(ctx, ["how does json.dumps work?"], ["q1"], [["doc.a"]])
    assert len(src.buffer["q1"].items) == 3 and step.per_query[0].dims == ("i1", "i2", "i3")
    assert len(step.samples) == 1 and step.samples[0][1] == [0] and step.samples[0][0].valid  # the writer's tokens
    # scores of 3 reports on the 3 items: item 2 never varies (std 0 -> dropped); K_max = 2 keeps the widest
    scores = torch.tensor([[0.9, 0.5, 0.1], [0.1, 0.5, 0.3], [0.5, 0.5, 0.2]])
    stats = src.observe(ctx, ["q"], ["q1"], [scores], [["best report", "worst report", "mid"]], [[2.0, 0.5, 1.0]])
    kept = [it.text for it in src.buffer["q1"].items]
    assert kept == [step.per_query[0].texts[0], step.per_query[0].texts[2]]  # std 0.327 and 0.082; 0.0 dropped
    assert stats["rubric/items_removed"] == 1.0 and stats["rubric/buffer_size"] == 2.0
    assert stats["rubric/item_std_mean"] == pytest.approx((scores[:, 0].std(unbiased=False) +
                                                            scores[:, 2].std(unbiased=False)).item() / 2)
    assert src.buffer["q1"].best == "best report" and src.buffer["q1"].worst == "worst report"
    # next visit: the writer contrasts best and worst and adds new items
    step2 = src.step_rubrics(ctx, ["how does json.dumps work?"], ["q1"], [["doc.a"]])
    assert len(src.buffer["q1"].items) == 4 and step2.stats["rubric/items_added"] == 2.0
    assert any(w < 0 for w in step2.per_query[0].weights)  # the "penalise this" item of the contrast
    # exact resume
    copy = EvolvingRubrics(max_items=2)
    copy.load_state_dict(json.loads(json.dumps(src.state_dict())))
    assert copy.buffer["q1"].items == src.buffer["q1"].items and copy.buffer["q1"].best == "best report"


def test_rler_initial_items_only_ablation_keeps_the_first_visits_items(tokenizer):
    """``rubric.evolve=false`` (DR Tulu's "initial rubrics only"): no pruning, no contrast items on later visits."""
    ctx = _ctx(tokenizer)
    src = EvolvingRubrics(max_items=2, init_items=3, new_items=2, evolve=False)
    first = src.step_rubrics(ctx, ["how does json.dumps work?"], ["q1"], [["doc.a"]])
    items = list(src.buffer["q1"].items)
    assert len(items) == 3 and len(first.samples) == 1
    scores = torch.tensor([[0.9, 0.5, 0.1], [0.1, 0.5, 0.3], [0.5, 0.5, 0.2]])  # item 2 has std 0: kept anyway
    stats = src.observe(ctx, ["q"], ["q1"], [scores], [["best report", "worst report", "mid"]], [[2.0, 0.5, 1.0]])
    assert src.buffer["q1"].items == items and stats["rubric/items_removed"] == 0.0
    again = src.step_rubrics(ctx, ["how does json.dumps work?"], ["q1"], [["doc.a"]])
    assert src.buffer["q1"].items == items and again.samples == [] and again.stats["rubric/items_added"] == 0.0
    assert again.per_query[0].dims == ("i1", "i2", "i3")


def test_rler_contrast_shows_what_the_contrasted_reports_searches_returned(tokenizer):
    """RLER grounds new items in the rollouts' evidence: the contrast prompt shows each report's passages, its cited
    ones first, and they survive a resume."""
    ctx = _ctx(tokenizer)
    src = EvolvingRubrics(max_items=3, init_items=3, new_items=2, max_passages=2, max_passage_chars=12)
    src.step_rubrics(ctx, ["how does json.dumps work?"], ["q1"], [["doc.a"]])
    scores = torch.tensor([[0.9, 0.5, 0.1], [0.1, 0.4, 0.3], [0.5, 0.6, 0.2]])
    found = [{"doc.x": "x passage text that runs long", "doc.a": "a passage", "doc.b": "b passage"},
             {"doc.c": "c passage"}, {}]
    calls = []

    def passages():
        calls.append(1)
        return [found]

    src.observe(ctx, ["q"], ["q1"], [scores], [["best cites [doc.a]", "worst report", "mid"]], [[2.0, 0.5, 1.0]],
                passages=passages)
    entry = src.buffer["q1"]
    assert calls == [1]  # computed once, when a contrast needed it
    assert entry.best_passages == "[doc.a] a passage\n[doc.x] x passage te"  # cited first, 2 at most, cut to 12 chars
    assert entry.worst_passages == "[doc.c] c passage"
    copy = EvolvingRubrics()
    copy.load_state_dict(json.loads(json.dumps(src.state_dict())))
    assert copy.buffer["q1"].best_passages == entry.best_passages
    seen = []
    ctx.engine = ScriptedEngine(tokenizer, lambda req: seen.append(req.prompt) or ProtocolResponder()(req))
    src.step_rubrics(ctx, ["how does json.dumps work?"], ["q1"], [["doc.a"]])
    assert "[Best report]\nbest cites [doc.a]\n\n[Passages its searches returned]\n[doc.a] a passage" in seen[0]
    assert "[Worst report]\nworst report\n\n[Passages its searches returned]\n[doc.c] c passage" in seen[0]


# ----------------------------------------------------------------------------- given rubrics
def _write(path, rows) -> str:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return str(path)


def test_drb_criteria_weights_normalised_per_and_across_dimensions(tmp_path):
    f = _write(tmp_path / "c.jsonl", [{"id": 7, "prompt": "q", "dimension_weight": {"comp": 3, "ins": 1},
                                       "criterions": {"comp": [{"criterion": "a", "explanation": "", "weight": 1},
                                                               {"criterion": "b", "explanation": "", "weight": 3}],
                                                      "ins": [{"criterion": "c", "explanation": "why", "weight": 5}]}}])
    r = load_given_rubrics(f)["7"]
    # comp: 3/4 of the total, split 1:3 -> 3/16, 9/16; ins: 1/4 -> 1/4
    assert r.weights == pytest.approx((3 / 16, 9 / 16, 1 / 4)) and sum(r.weights) == pytest.approx(1.0)
    assert r.texts == ("[comp] a", "[comp] b", "[ins] c")


def test_binary_checklist_scoring(tmp_path):
    from score_lightning.step.reward_assembly import rubric_part

    f = _write(tmp_path / "b.jsonl", [{"id": "q1", "rubrics": [{"text": "cites", "weight": 3, "type": "binary"},
                                                                {"text": "concludes", "weight": 1, "type": "binary"}]}])
    r = load_given_rubrics(f)["q1"]
    assert r.binary and r.weights == pytest.approx((0.75, 0.25))
    assert rubric_part(torch.tensor([[0.8, 0.3], [0.4, 1.0]]), r).tolist() == pytest.approx([0.75, 0.25])


def test_drb2_tasks_file_loads_as_given_binary_rubrics():
    """DeepResearch Bench II's published tasks_and_rubrics.jsonl (the hand-written sample): each task's distinct
    items, dimension-tagged, equal weights, binary."""
    from pathlib import Path

    from score_lightning.data.drb2_tasks import load_drb2_tasks

    path = Path(__file__).resolve().parent / "data" / "drb2" / "tasks_and_rubrics.jsonl"
    tasks, rubrics = load_drb2_tasks(path), load_given_rubrics(path)
    assert set(rubrics) == set(tasks)
    for tid, task in tasks.items():
        want = [f"[{d}] {x}" for d in task.rubric for x in task.distinct(d)]
        r = rubrics[tid]
        assert r.binary and list(r.texts) == want and r.weights == pytest.approx([1 / len(want)] * len(want))


@pytest.mark.parametrize("line, message", [
    ("{not json", "invalid JSON"),
    ('{"id": 1, "rubrics": []}', '"rubrics" must be a non-empty list'),
    ('{"id": 1, "rubrics": [{"text": "x", "weight": -1}]}', "weight must be a positive number"),
    ('{"id": 1, "dimension_weight": {"a": 1}, "criterions": {}}', "has no list for dimension 'a'"),
    ('{"id": 1, "other": 2}', "neither a DRB criteria line"),
])
def test_malformed_rubric_files_are_refused_with_file_and_line(tmp_path, line, message):
    from score_lightning.launch.config_validation import ConfigError, validate_config

    f = _write(tmp_path / "bad.jsonl", ['{"id": 0, "rubrics": [{"text": "fine", "weight": 1}]}', line])
    with pytest.raises(ConfigError) as err:
        validate_config(compose(FAST + ["rubric=given", f"rubric.path={f}"]))
    assert f"{f}:2: " in str(err.value) and message in str(err.value)


def test_malformed_preferences_are_refused_with_file_and_line(tmp_path):
    from score_lightning.launch.config_validation import ConfigError, validate_config

    f = _write(tmp_path / "p.jsonl", ['{"id": 1, "prompt": "q", "chosen": "a", "rejected": "b"}',
                                      '{"id": 2, "prompt": "q", "chosen": ""}'])
    with pytest.raises(ConfigError, match=f"{f}:2: .*chosen"):
        validate_config(compose(FAST + ["evaluator.reward=preference", f"evaluator.preferences_path={f}"]))


def test_query_without_a_given_rubric_uses_the_fallback_and_is_counted(tmp_path, tokenizer):
    from score_lightning.methods.given.rubrics import GivenRubrics

    f = _write(tmp_path / "b.jsonl", [{"id": "q1", "rubrics": [{"text": "cites", "weight": 1}]}])
    step = GivenRubrics(f).step_rubrics(_ctx(tokenizer), ["a", "b"], ["q1", "q9"], [[], []])
    assert step.per_query[0].texts == ("cites",) and step.fallback == [False, True]
    assert step.per_query[1].dims == step.per_query[1].dims and not step.per_query[1].texts  # harness fallback
    assert step.stats["rubric/missing_rate"] == 0.5


# ----------------------------------------------------------------------------- preference reward
def test_preference_agreement_on_fixed_scores(tmp_path):
    f = _write(tmp_path / "p.jsonl", [{"id": i, "prompt": f"q{i}", "chosen": "good", "rejected": "bad"}
                                      for i in range(3)])
    rubric = Rubric(("factual_support", "insight"), (0.5, 0.5))

    def score_pairs(prompts, groups):  # scores report 1 8/8 and report 2 2/2, or 5/5 for both ("tie")
        out = []
        for p, g in zip(prompts, groups):
            out.append([[0.5, 0.5] if p == "q2" else ([0.8, 0.8] if r == "good" else [0.2, 0.2]) for r in g])
        return out

    reward = PreferenceReward(f, pairs_per_step=3).reward(0, rubric, score_pairs, None)
    assert reward == pytest.approx((1 + 1 + 0.5) / 3)  # two right, one tie; positions alternate


def test_a_failed_appraisal_is_counted_and_never_a_grade_of_0(tmp_path):
    """The hybrid reward over a real loopback endpoint: a grade mixes in; a failed appraisal leaves the agreement."""
    from openai_stub import OpenAIStub, Reply

    f = _write(tmp_path / "p.jsonl", [{"id": 0, "prompt": "q0", "chosen": "good", "rejected": "bad"}])
    rubric = Rubric(("factual_support", "insight"), (0.5, 0.5))

    def score_pairs(prompts, groups):
        return [[[0.8, 0.8] if r == "good" else [0.2, 0.2] for r in g] for g in groups]

    with OpenAIStub(content="6") as stub:
        pref = PreferenceReward(f, pairs_per_step=1, appraisal_weight=0.5,
                                appraisal={"base_url": stub.base_url, "model": "m", "max_retries": 0})
        assert pref.reward(0, rubric, score_pairs, None) == pytest.approx(0.5 * 1.0 + 0.5 * 0.6)
        stub.script(Reply(status=500))
        assert pref.reward(1, rubric, score_pairs, None) == pytest.approx(1.0)  # agreement alone, not 0.5 * 1 + 0
        stub.script(Reply(content="excellent"))
        assert pref.reward(2, rubric, score_pairs, None) == pytest.approx(1.0)
    assert pref.appraisal_failures == 2


# ----------------------------------------------------------------------------- each mode on the CLI
MODES = {
    "score": ([], "evaluator/consistency"),
    "evolving": (["rubric=evolving"], "rubric/buffer_size"),
    "given": (["rubric=given", f"rubric.path={ROOT}/src/score_lightning/data/assets/criteria_tiny.jsonl"],
              "rubric/missing_rate"),
    "discriminative": (["evaluator.reward=discriminative"], "evaluator/discriminative"),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_each_mode_runs_three_steps(mode, tmp_path, tiny_ckpt):
    extra, tag = MODES[mode]
    out = tmp_path / mode
    train([*FAST, "rollout=scripted", "solver.num_rollouts=3", "trainer.max_steps=3", "solver.max_response_tokens=200",
           "evaluator.max_response_tokens=500", "evaluator.max_rubric_tokens=160", f"paths.output_dir={out}", *extra])
    scalars = read_scalars(out / "tensorboard")
    for key in ("solver/reward_mean", "solver/reward_score_part", "evaluator/rubric_valid_rate", tag):
        values = [v for _, v in scalars[key]]
        assert len(values) == 3 and all(math.isfinite(v) for v in values), (key, values)
    if mode == "evolving":
        assert "rubric/items_added" in scalars and sum(v for _, v in scalars["rubric/items_added"]) > 0
        assert [v for _, v in scalars["rubric/write_fail_rate"]][0] == 0.0  # the scripted writer's items all parse
    if mode in ("score", "evolving", "discriminative"):
        assert [v for _, v in scalars["evaluator/updated"]] == [1.0] * 3  # the rubric writer trained


def test_discriminative_reward_pools_group_spreads(tokenizer):
    from score_lightning.step.evaluator_phase import sample_rewards
    from score_lightning.step.objectives import EVALUATOR_REWARDS
    from score_lightning.step.scalars import StepScalars
    from score_lightning.step.types import RubricSample, StepRubric

    part = torch.tensor([0.2, 0.6, 0.4, 0.5, 0.5, 0.0, 0.9, 0.1, 0.3])
    # query 1: all valid; query 2: the third report is invalid (its 0.0 must not count); query 3: one valid only
    valid = [True, True, True, True, True, False, True, False, False]
    rw = SimpleNamespace(answers=[SimpleNamespace(valid=v, answer="r" if v else None) for v in valid],
                         rubric_part=part, rewards=part + 1)
    rubric = Rubric(("factual_support",), (1.0,))
    ro = SimpleNamespace(rubrics=StepRubric([rubric] * 3, [(RubricSample(rubric, True, "", [1], [2], [1]), None)]))
    rewards, consistency = sample_rewards(EVALUATOR_REWARDS.get("discriminative"), ro, rw, StepScalars(), 3, 0.0)
    # std(0.2, 0.6, 0.4) and std(0.5, 0.5) = 0 pooled over the two queries with two or more valid reports
    assert rewards[0] == pytest.approx((part[:3].std(unbiased=False).item() + 0.0) / 2)


def test_discriminative_reward_without_a_valid_group_is_no_signal(tokenizer):
    """A step where no query has two valid reports (common at a tiny cold start) gives the rubric no reward and logs
    NaN, instead of failing the step: the tag exists on every rank, so the collective reduction stays in step."""
    from score_lightning.step.evaluator_phase import sample_rewards
    from score_lightning.step.objectives import EVALUATOR_REWARDS
    from score_lightning.step.scalars import StepScalars
    from score_lightning.step.types import RubricSample, StepRubric

    part = torch.tensor([0.2, 0.0, 0.0, 0.7, 0.0, 0.0])
    valid = [True, False, False, True, False, False]  # one valid report per query: no spread anywhere
    rw = SimpleNamespace(answers=[SimpleNamespace(valid=v, answer="r" if v else None) for v in valid],
                         rubric_part=part, rewards=part + 1)
    rubric = Rubric(("factual_support",), (1.0,))
    ro = SimpleNamespace(rubrics=StepRubric([rubric] * 2, [(RubricSample(rubric, True, "", [1], [2], [1]), None)]))
    sc = StepScalars()
    rewards, _ = sample_rewards(EVALUATOR_REWARDS.get("discriminative"), ro, rw, sc, 3, 0.0)
    assert rewards == [None]  # no signal: the sample is left out of the REINFORCE update
    assert math.isnan(sc.compute()["evaluator/discriminative"])
