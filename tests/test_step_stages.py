"""The SCORE step's stages as plain functions: reward assembly, evaluator reward, mini-batches,
prompts, the scripted engine, cross-rank scalars and the fidelity switches of the config."""

from __future__ import annotations

import json
import math

import pytest
import torch

from helpers import FAST, compose, plain_grpo
from score_lightning import protocol as P
from score_lightning.harness.state import HarnessState
from score_lightning.step.losses import grpo_token_loss
from score_lightning.roles.answer import parse_answer
from score_lightning.roles.evaluation import parse_evaluation
from score_lightning.roles.evidence import EvidenceDoc
from score_lightning.roles.prompts import CONCLUSION_INSTRUCTION, rubric_messages, solver_messages
from score_lightning.roles.rubric import Rubric
from score_lightning.rollout.engine import SamplingParams
from score_lightning.rollout.scripted import ProtocolResponder, ScriptedEngine, ScriptRequest
from score_lightning.step import evaluator_reward as ER
from score_lightning.step.reward_assembly import combine, effective_tau, meets_process_rules
from score_lightning.step.rollouts import initial_evidence
from score_lightning.step.scalars import StepScalars
from score_lightning.step.solver_update import GRPOSettings

RUB = Rubric(("factual_support", "insight"), (0.6, 0.4))


def _state(**pc) -> HarnessState:
    return HarnessState.from_dict({"process_constraints": pc})


def _verifier(**kw):
    """A ``verifier`` node: what ``combine`` reads of it."""
    from omegaconf import OmegaConf

    return OmegaConf.create({"enabled": True, "min_search_depth": 1, "tau_from_harness": False, "zero": "reward", **kw})


ANSWERS = [parse_answer("<answer>First report [a]. Conclusion: yes.</answer>"),
           parse_answer("<answer>Second report [b]. Conclusion: no.</answer>"),
           parse_answer("no answer")]


def test_effective_tau_is_fixed_unless_coupled_to_the_harness():
    assert effective_tau(1, _state(min_number_of_tool_call=3)) == 1  # the paper's fixed tau_s
    assert effective_tau(1, _state(min_number_of_tool_call=3), from_harness=True) == 3
    assert effective_tau(2, _state(min_number_of_tool_call=0), from_harness=True) == 2


def test_combine_by_hand_both_verifier_modes():
    rows = [torch.tensor([[1.0, 0.5], [0.5, 0.0], [1.0, 1.0]])]
    # report 1 verified (depth 2 >= tau 2); reports 2 and 3 not (depth 1)
    rw = combine(ANSWERS, rows, [RUB], [2, 1, 1], [True] * 3, [True], 2, _verifier())
    # R1 = 1 + 0.6 + 0.2 = 1.8; R2 unverified -> 0 (Algorithm 1, line 23); R3 invalid -> 0
    assert rw.rewards.tolist() == pytest.approx([1.8, 0.0, 0.0])
    rw = combine(ANSWERS, rows, [RUB], [2, 1, 1], [True] * 3, [True], 2, _verifier(zero="scores"))
    assert rw.rewards.tolist() == pytest.approx([1.8, 1.0, 0.0])  # R2 keeps a(r) = 1
    rw = combine(ANSWERS, rows, [RUB], [2, 1, 1], [True] * 3, [True], 2, _verifier(enabled=False))
    assert rw.rewards.tolist() == pytest.approx([1.8, 1.3, 0.0])  # the "no verifier" ablation


def test_per_query_item_rubrics_binary_and_penalties_by_hand():
    """Given/evolving rubrics differ by query; binary items count 0/1; penalties clip the part to [0, 1]."""
    from score_lightning.step.reward_assembly import rubric_part

    binary = Rubric(("c1", "c2"), (0.75, 0.25), ("cites docs", "names the module"), binary=True)
    assert rubric_part(torch.tensor([[0.6, 0.4], [0.2, 0.9]]), binary).tolist() == pytest.approx([0.75, 0.25])
    flawed = Rubric(("i1", "i2"), (1.0, -0.5), ("explains", "invents a function"))
    assert rubric_part(torch.tensor([[0.8, 0.4], [0.1, 1.0]]), flawed).tolist() == pytest.approx([0.6, 0.0])
    two = [torch.tensor([[1.0, 0.5], [0.5, 0.0], [1.0, 1.0]]), torch.tensor([[0.6, 0.4], [0.2, 0.9], [1.0, 1.0]])]
    rw = combine(ANSWERS + ANSWERS, two, [RUB, binary], [1] * 6, [True] * 6, [True, True], 1, _verifier())
    assert rw.rewards.tolist() == pytest.approx([1.8, 1.3, 0.0, 1.75, 1.25, 0.0])


def _evaluation(with_verification: list[bool], with_gap: list[bool]) -> str:
    body = ""
    for i, (v, g) in enumerate(zip(with_verification, with_gap), 1):
        body += (f'<report id="{i}">' + ("<verification>ok</verification>" if v else "")
                 + ("<gap_analysis>none</gap_analysis>" if g else "")
                 + '<scores><score dim="factual_support" value="8"/><score dim="insight" value="5"/></scores></report>')
    return f"<report_evaluations>{body}</report_evaluations>"


def test_process_rules_gate_the_whole_evaluation():
    ev = parse_evaluation(_evaluation([True, False], [True, True]), RUB, 2)
    assert meets_process_rules(ev, 2, _state(require_verification=False).process_constraints)  # no rule: always met
    assert not meets_process_rules(ev, 2, _state(require_verification=True).process_constraints)
    assert meets_process_rules(ev, 2, _state(require_gap_analysis=True, require_verification=False).process_constraints)
    ev2 = parse_evaluation(_evaluation([True, True], [True, False]), RUB, 2)
    assert not meets_process_rules(ev2, 2, _state(require_gap_analysis=True, require_verification=False).process_constraints)
    missing = parse_evaluation(_evaluation([True], [True]), RUB, 2)  # report 2 missing
    assert not meets_process_rules(missing, 2, _state(require_verification=True).process_constraints)


def test_evaluator_reward_rules():
    from score_lightning.step.objectives import EVALUATOR_REWARDS

    assert ER.rubric_reward(True, 0.4, 0.0) == 0.4
    assert ER.rubric_reward(True, float("nan"), 0.0) is None  # no group with 2 valid reports
    assert ER.rubric_reward(False, float("nan"), -0.1) == -0.1  # invalid rubric
    assert ER.rubric_reward(True, 1.5, 0.0) == 1.5  # the "no consistency" ablation's mean reward
    with pytest.raises(KeyError, match="evaluator.reward='rubric'"):
        EVALUATOR_REWARDS.get("rubric")


def test_discriminative_and_per_query_values_by_hand():
    part = torch.tensor([0.2, 0.6, 0.4, 0.5, 0.5, 0.5])  # query 1 spread; query 2 all equal
    spreads = ER.group_spreads(part, [True] * 6, 3)
    assert spreads == pytest.approx([math.sqrt(((0.2 - 0.4) ** 2 + 0.2 ** 2 + 0) / 3), 0.0])
    # only valid reports count: 0.2 and 0.6 around 0.4; a query with one valid report has no spread
    assert ER.group_spreads(part, [True, True, False, True, False, False], 3) == [pytest.approx(0.2), None]
    rewards = torch.tensor([1.2, 1.6, 0.0, 1.5, 1.5, 1.5])
    inputs = ER.RewardInputs(ANSWERS * 2, part, rewards, [True] * 6, 3, math.nan)
    assert ER.SOLVER_REWARD.query_values(inputs) == pytest.approx([2.8 / 3, 1.5])
    values = ER.CONSISTENCY.query_values(inputs)
    assert values[0] == pytest.approx(0.0)  # "yes." vs "no.": no shared word


def test_valid_conclusion_groups_keep_only_valid_reports():
    groups = ER.valid_conclusion_groups(ANSWERS + ANSWERS[:1] + ANSWERS[2:] * 2, 3)
    assert groups == [["yes.", "no."]]  # the second group has a single valid report: no pair


def test_global_mini_batches_are_strided_and_rank_invariant():
    s = GRPOSettings(2, 1.0, 2, 4, 1, 0.2, 0.2, 0.0, 10.0, 0.0, 1e-6, **plain_grpo())
    one = s.mini_batches(4, world=1)  # queries 0..3 -> mini-batches {0, 2} and {1, 3}
    assert one == [[0, 1, 4, 5], [2, 3, 6, 7]]
    # two ranks, each with 2 of the 4 queries: rank r's local query i is global query 2r + i
    two = s.mini_batches(2, world=2)
    assert two == [[0, 1], [2, 3]]
    glob = [sorted({2 * r + row // 2 for r in (0, 1) for row in rows}) for rows in two]
    assert glob == [[0, 2], [1, 3]] == [sorted({row // 2 for row in rows}) for rows in one]
    with pytest.raises(ValueError, match="divisible"):
        GRPOSettings(2, 1.0, 3, 4, 1, 0.2, 0.2, 0.0, 10.0, 0.0, 1e-6, **plain_grpo()).mini_batches(3, world=2)


def test_kl_clamp_reaches_the_solver_loss():
    logp = torch.zeros(1, 3, requires_grad=True)
    ref = torch.tensor([[10.0, 0.0, -10.0]])  # k3 = e^r - r - 1: e^10 - 11, 0, e^-10 + 9
    mask = torch.ones(1, 3)
    kw = dict(clip_low=0.2, clip_high=0.2, kl_coef=1.0)
    _, st = grpo_token_loss(logp, logp.detach(), ref, torch.zeros(1), mask, kl_clamp=2.0, **kw)
    assert float(st["kl"]) == pytest.approx(2.0 + 0.0 + 2.0)
    _, st = grpo_token_loss(logp, logp.detach(), ref, torch.zeros(1), mask, **kw)  # default clamp 10
    assert float(st["kl"]) == pytest.approx(10.0 + 0.0 + math.exp(-10) + 9.0)


def test_prompts_carry_evidence_and_optional_conclusion_line():
    state = HarnessState()
    docs = [[EvidenceDoc("json.loads", "Deserialize s to a Python object."), EvidenceDoc("json.load")], []]
    msgs = rubric_messages(["how to parse json?", "paths?"], state, evidence=docs)
    assert ("1. how to parse json?\n   initial evidence:\n   - [json.loads] Deserialize s to a Python object.\n"
            "   - [json.load]\n2. paths?\n") in msgs[1]["content"]
    assert msgs == rubric_messages(["how to parse json?", "paths?"], state, evidence=docs)
    assert "initial evidence" not in rubric_messages(["q"], state)[1]["content"]
    assert CONCLUSION_INSTRUCTION in solver_messages("q", RUB, state, 3)[0]["content"]
    assert "Conclusion:" not in solver_messages("q", RUB, state, 3, conclusion_line=False)[0]["content"]


def test_initial_evidence_shows_titles_or_opening_words(bm25):
    """D_q^0 reaches the rubric prompt with what each document is, not only its id: the title when it
    says more than the id (wiki-18: numeric ids, article titles), else the passage's opening ~30 tokens."""
    from score_lightning.retrieval.base import SearchHit
    from score_lightning.roles.evidence import EVIDENCE_WORDS

    wiki = EvidenceDoc.from_hit(SearchHit("1234567", '"Eiffel Tower"\nThe Eiffel Tower is a wrought-iron tower.', 1.0))
    assert wiki.line() == "[1234567] Eiffel Tower"
    long = " ".join(f"w{i}" for i in range(100))
    same = EvidenceDoc.from_hit(SearchHit("json.loads", f'"json.loads"\n{long}', 1.0))
    assert same.label == " ".join(f"w{i}" for i in range(EVIDENCE_WORDS)) + " ..."
    evidence, errors = initial_evidence(bm25, ["how do I parse a JSON string?"], 2)
    assert errors == 0 and len(evidence[0]) == 2
    hits = bm25.search(["how do I parse a JSON string?"], 2)[0]
    assert [d.id for d in evidence[0]] == [h.id for h in hits]
    assert all(d.label and d.label.split()[0] in h.text for d, h in zip(evidence[0], hits))  # the stdlib: id == title


def test_numeric_ids_are_cited():
    a = parse_answer("<answer>The capital is Paris [123], per the atlas [45-2].</answer>", require_citation=True)
    assert a.valid and a.cited_ids == ("123", "45-2")


# ----------------------------------------------------------------------------- scripted engine
def test_scripted_engine_honours_stops_budget_and_threads(tokenizer):
    tok = tokenizer
    calls = []

    def respond(req: ScriptRequest) -> str:
        calls.append((req.index, req.turn))
        return f"<think>k{req.index}</think><search>q{req.turn}</search> trailing words"

    eng = ScriptedEngine(tok, respond)
    prompt = tok("a prompt", add_special_tokens=False)["input_ids"]
    stop = tok(P.SEARCH_CLOSE, add_special_tokens=False)["input_ids"]
    gens = eng.generate([prompt, prompt], SamplingParams(64, stop_token_ids=tuple(stop)))
    assert [tok.decode(g.token_ids) for g in gens] == ["<think>k0</think><search>q0</search>",
                                                       "<think>k1</think><search>q1</search>".replace("q1", "q0")]
    assert all(g.finish_reason == "stop" for g in gens)
    # the second turn continues each thread (prompt + its own tokens + an observation)
    obs = tok("\n<observation>x</observation>\n", add_special_tokens=False)["input_ids"]
    nxt = [prompt + gens[1].token_ids + obs, prompt + gens[0].token_ids + obs]
    gens2 = eng.generate(nxt, SamplingParams(64, stop_strings=("</search>",)))
    assert [tok.decode(g.token_ids) for g in gens2] == ["<think>k1</think><search>q1</search>",
                                                        "<think>k0</think><search>q1</search>"]
    assert calls == [(0, 0), (1, 0), (1, 1), (0, 1)]
    cut = eng.generate([tok("other", add_special_tokens=False)["input_ids"]], SamplingParams(3))[0]
    assert len(cut.token_ids) == 3 and cut.finish_reason == "length"


def test_protocol_responder_writes_a_valid_rubric_for_the_prompt_constraints():
    from score_lightning.roles.rubric import parse_rubric

    state = HarnessState.from_dict({"dimension_constraints": {"k": 4, "must_include": ["insight"], "weight_min": 0.1,
                                                              "weight_max": 0.4}})
    text = "\n".join(m["content"] for m in rubric_messages(["q"], state))
    out = ProtocolResponder().rubric(ScriptRequest("rubric", "q", 0, 0, text, text))
    parsed = parse_rubric(out, state)
    assert parsed.valid, parsed.error
    assert parsed.rubric.dims[0] == "insight" and len(parsed.rubric.dims) == 4


# ----------------------------------------------------------------------------- scalars
def test_step_scalars_pool_and_report_nothing_measured_as_nan():
    sc = StepScalars()
    sc.mean("x/rate", 3.0, 4)
    sc.mean("x/rate", 1.0, 4)
    sc.mean("x/none", 0.0, 0)
    sc.max("time/t", 1.0)
    sc.max("time/t", 3.0)
    sc.sum("n", 2.0)
    sc.reward.update(torch.tensor([1.0, 1.0]), torch.tensor([[1.0], [0.0]]), torch.tensor([1.0]))  # R = 2, 1
    sc.reward_sq.update(torch.tensor([4.0, 1.0]))
    out = sc.compute()
    assert out["x/rate"] == pytest.approx(0.5) and math.isnan(out["x/none"])
    assert out["time/t"] == 3.0 and out["n"] == 2.0
    assert out["solver/reward_mean"] == pytest.approx(1.5) and out["solver/reward_std"] == pytest.approx(0.5)
    assert math.isnan(out["evaluator/consistency"])  # no group with two valid reports
    assert math.isnan(sc.compute()["x/rate"])  # reset after compute


# ----------------------------------------------------------------------------- config switches
def test_frozen_solver_with_shared_actor_is_refused_by_name():
    from score_lightning.launch.config_validation import ConfigError, validate_config

    with pytest.raises(ConfigError, match="solver.freeze=true: with actor.shared=true"):
        validate_config(compose(FAST + ["solver.freeze=true"]))
    validate_config(compose(FAST + ["solver.freeze=true", "actor.shared=false"]))
    validate_config(compose(FAST + ["solver.freeze=true", "evaluator.enabled=false"]))
    with pytest.raises(ConfigError, match="verifier.zero='all'"):
        validate_config(compose(FAST + ["verifier.zero=all"]))
    with pytest.raises(ConfigError, match="mini_batch_size=1: counts global queries"):
        validate_config(compose(FAST + ["strategy=ddp", "trainer.devices=2", "data.batch_size=2"]))


def test_rule_harness_is_built_from_the_configured_state():
    from hydra.utils import instantiate

    cfg = compose(FAST)
    harness = instantiate(cfg.harness.backend)
    state = HarnessState.from_dict(json.loads(json.dumps(dict(
        __import__("omegaconf").OmegaConf.to_container(cfg.harness.initial_state)))))
    healthy = {"verified_rate": 0.9, "consistency": 0.5, "reward_std": 0.2, "rubric_valid_rate": 0.9}
    new = harness.update(state, healthy)
    assert new.dimension_constraints == state.dimension_constraints  # k = 3, weight_max = 0.6 stay
    assert new.process_constraints == state.process_constraints


def test_scoring_temperature_defaults_to_the_evaluator_temperature_and_is_validated():
    from score_lightning.launch.config_validation import ConfigError, validate_config
    from score_lightning.step.rollouts import rollout_settings

    cfg = compose(FAST)
    base = rollout_settings(cfg.solver, cfg.evaluator)
    assert base.scoring.temperature == pytest.approx(0.8)  # the paper's evaluator temperature, rubric and scoring
    greedy = compose(FAST + ["evaluator.scoring_temperature=0"])
    validate_config(greedy)
    s = rollout_settings(greedy.solver, greedy.evaluator)
    assert s.scoring.temperature == 0.0 and s.solver.temperature == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="evaluator.scoring_temperature"):
        validate_config(compose(FAST + ["evaluator.scoring_temperature=-0.5"]))


def test_rubric_prompt_shortens_evidence_labels_to_fit_its_budget(tokenizer):
    """Harness notes grow during a run; a rubric prompt that no longer fits cuts D_q^0's labels, then drops them,
    instead of failing the run mid-way (seen at step 19 of a tiny_score run)."""
    from score_lightning.harness.scheduler import DimensionScheduler
    from score_lightning.rollout.chat import encode_chat
    from score_lightning.roles.evidence import EvidenceDoc
    from score_lightning.step.rubric_stage import RubricSampling, fitted_rubric_prompt, rubric_prompt

    state = _state()
    sched = DimensionScheduler(list(state.dimension_pool))
    long = " ".join(["serialise the object to a JSON formatted string with options"] * 3)
    evidence = [[EvidenceDoc("json.dumps", long), EvidenceDoc("json.loads", long)]]
    full = lambda words: len(encode_chat(tokenizer, rubric_prompt(["q?"], evidence, state, sched,  # noqa: E731
                                                                  RubricSampling(8, 1.0, 10_000, 8), words)))
    assert full(None) > full(8) > full(0)
    for cap, words in ((full(None), None), (full(None) - 1, 8), (full(8) - 1, 0)):
        msgs = fitted_rubric_prompt(tokenizer, ["q?"], evidence, state, sched, RubricSampling(8, 1.0, cap, 8))
        assert msgs == rubric_prompt(["q?"], evidence, state, sched, RubricSampling(8, 1.0, cap, 8), words)
    text = fitted_rubric_prompt(tokenizer, ["q?"], evidence, state, sched,
                                RubricSampling(8, 1.0, full(8) - 1, 8))[1]["content"]
    assert "[json.dumps]" in text and "serialise" not in text  # ids kept, labels gone
