"""The supervised cold start's demonstrations: they parse with the project's own parsers, observations are
exactly the agent loop's (and masked), and shared-prompt SFT equals separate rows. Training and cache:
``test_sft_training.py``."""

from __future__ import annotations

import pytest
import torch

from score_lightning import protocol as P
from score_lightning.harness.state import HarnessState
from score_lightning.roles.answer import parse_answer
from score_lightning.roles.evaluation import parse_evaluation
from score_lightning.roles.rubric import Rubric, check_rubric, parse_rubric
from score_lightning.rollout.agent import _wrap_observation, format_observation
from score_lightning.rollout.chat import encode_chat
from score_lightning.sft.demo_types import RUBRIC, SCORING, SOLVER, DemoBudgets, demo_budgets
from score_lightning.sft.demos import build_demos
from score_lightning.sft.rubric_demos import random_state, weight_plans


#: the RL budgets the demos are checked against: experiment=tiny_score's (checked below)
BUDGETS = DemoBudgets(max_prompt_tokens=1024, solver_max_response_tokens=384, solver_max_tool_calls=3,
                      max_observation_tokens=64, topk=2, max_rubric_tokens=192, evaluator_max_response_tokens=768,
                      evaluator_max_tool_calls=2, max_report_tokens=96, num_rollouts=4, scoring="pointwise",
                      show_retrieved=True)
BASE = HarnessState.from_dict({"dimension_constraints": {"k": 3, "must_include": ["factual_support"],
                                                         "weight_min": 0.1, "weight_max": 0.6}})


@pytest.fixture(scope="module")
def queries():
    from score_lightning.data.queries import load_queries

    return [q.prompt for q in load_queries(None)]


PER_PROMPT = {SOLVER: 4, RUBRIC: 6, SCORING: 2}


@pytest.fixture(scope="module")
def demos(tokenizer, bm25, queries):
    demos, stats = build_demos(tokenizer, bm25, queries, BUDGETS, 40, 96, 16, seed=0, base_state=BASE,
                               per_prompt=PER_PROMPT)
    assert stats.built == {SOLVER: 40, RUBRIC: 96, SCORING: 16}
    # responses of one group share their prompt and differ from each other
    groups: dict[int, list] = {}
    for d in demos:
        groups.setdefault(d.group, []).append(d)
    varied = []
    for g in groups.values():
        assert len({tuple(d.prompt_ids) for d in g}) == 1 and len(g) == PER_PROMPT[g[0].kind]
        if g[0].kind != SCORING:
            varied.append(len({tuple(d.response_ids) for d in g}) > 1)
    assert sum(varied) >= 0.8 * len(varied)  # (a state whose must-includes fill k has only one rubric)
    return demos


def _kind(demos, kind):
    return [d for d in demos if d.kind == kind]


def _model_text(tok, d):
    return tok.decode([t for t, m in zip(d.response_ids, d.response_mask) if m])


def _masked_spans(d) -> list[list[int]]:
    spans, cur = [], []
    for t, m in zip(d.response_ids, d.response_mask):
        if m == 0:
            cur.append(t)
        elif cur:
            spans.append(cur)
            cur = []
    if cur:
        spans.append(cur)
    return spans


# ---------------------------------------------------------------------------- demonstrations
def test_solver_demos_are_valid_answers_citing_retrieved_docs(demos, tokenizer):
    tok = tokenizer
    searches = set()
    for d in _kind(demos, SOLVER):
        assert d.response_ids[-1] == tok.eos_token_id and d.response_mask[-1] == 1
        text = _model_text(tok, d)
        assert text.rstrip().endswith(P.ANSWER_CLOSE + P.IM_END)
        a = parse_answer(text, False, require_citation=True)
        assert a.valid, (a.reason, text)
        assert a.cited_ids and set(a.cited_ids) <= set(d.meta["retrieved_ids"]), (a.cited_ids, d.meta["retrieved_ids"])
        assert "Conclusion:" in a.answer
        assert 1 <= d.meta["tool_calls"] <= BUDGETS.solver_max_tool_calls
        assert len(d.response_ids) <= BUDGETS.solver_max_response_tokens
        assert len(d.prompt_ids) <= BUDGETS.max_prompt_tokens
        assert text.count(P.SEARCH_OPEN) == d.meta["tool_calls"]
        searches.add(d.meta["tool_calls"])
    assert searches == {1, 2, 3}, "demos vary the number of searches"


def test_observation_tokens_are_masked_and_equal_the_agent_loops(demos, tokenizer, bm25):
    tok = tokenizer
    for d in _kind(demos, SOLVER) + _kind(demos, SCORING):
        max_calls = BUDGETS.solver_max_tool_calls if d.kind == SOLVER else BUDGETS.evaluator_max_tool_calls
        expected = []
        for i, q in enumerate(d.meta["search_queries"], 1):
            ids, _ = format_observation(bm25.search([q], BUDGETS.topk)[0], BUDGETS.max_observation_tokens, tok)
            if i >= max_calls:
                finish = P.ANSWER_CLOSE if d.kind == SOLVER else P.EVALS_CLOSE  # each role's own notice
                ids = ids + _wrap_observation(P.tool_budget_observation(finish), 64, tok)
            expected.append(ids)
        assert _masked_spans(d) == expected
        # the mask is 0 exactly on observation tokens: every masked span decodes to <observation> blocks
        for span in _masked_spans(d):
            assert tok.decode(span).startswith("\n" + P.OBS_OPEN) and tok.decode(span).endswith(P.OBS_CLOSE + "\n")


def test_rubric_demos_satisfy_their_constraints(demos, tokenizer):
    ks, first_weights, dims_seen = set(), set(), set()
    for d in _kind(demos, RUBRIC):
        state = HarnessState.from_dict(d.meta["state"])
        text = tokenizer.decode(d.response_ids)
        assert text.endswith(P.DIMENSIONS_CLOSE) and all(m == 1 for m in d.response_mask)
        parsed = parse_rubric(text, state)
        assert parsed.valid, (parsed.error, text)
        assert list(parsed.rubric.dims) == d.meta["rubric"][0]
        assert len(d.response_ids) <= BUDGETS.max_rubric_tokens
        assert len(d.prompt_ids) <= BUDGETS.max_prompt_tokens
        ks.add(state.dimension_constraints.k)
        first_weights.add(parsed.rubric.weights[0])
        dims_seen.update(parsed.rubric.dims)
    assert len(ks) >= 2 and len(first_weights) >= 2 and len(dims_seen) >= 10, "demos vary k, weights and dimensions"


def test_scoring_demos_parse_with_the_right_k_and_scores_follow_quality(demos, tokenizer):
    good, bad = [], []
    for d in _kind(demos, SCORING):
        state = HarnessState.from_dict(d.meta["state"])
        rubric = Rubric(*d.meta["rubric"])
        K = d.meta["num_reports"]
        pc = state.process_constraints
        text = _model_text(tokenizer, d)
        ev = parse_evaluation(text, rubric, K, require_verification=pc.require_verification,
                              require_gap_analysis=pc.require_gap_analysis)
        assert ev.valid, (ev.error, text)
        assert parse_evaluation(text, rubric, K + 1).valid is False  # exactly K reports
        assert d.meta["tool_calls"] >= max(1, pc.min_number_of_tool_call)  # the verifier needs depth >= 1
        assert len(d.response_ids) <= BUDGETS.evaluator_max_response_tokens
        for rid, kind in enumerate(d.meta["kinds"], 1):
            mean = sum(ev.reports[rid].scores.values()) / len(rubric.dims)
            (good if kind == "good" else bad if kind in ("off_topic", "empty") else []).append(mean)
    assert good and bad and min(good) > max(bad)


def test_pointwise_demos_show_one_report_with_its_sources_and_verify_its_citations(demos, tokenizer, bm25, queries):
    """tiny_score's scoring demos: one report per prompt, shown under the ids its searches returned; the
    verification says whether its citations are among them, and ungrounded reports score below good ones."""
    from dataclasses import replace

    from score_lightning.roles.prompts import retrieved_line

    seen, grounded, ungrounded = set(), [], []
    for d in _kind(demos, SCORING):
        (kind,), (sources,) = d.meta["kinds"], d.meta["sources"]
        prompt, text = tokenizer.decode(d.prompt_ids), _model_text(tokenizer, d)
        assert d.meta["num_reports"] == 1 and "[Report 2]" not in prompt and retrieved_line(sources) in prompt
        verification = text.split(P.VERIFICATION_OPEN)[-1].split(P.VERIFICATION_CLOSE)[0]
        mean = sum(parse_evaluation(text, Rubric(*d.meta["rubric"]), 1).reports[1].scores.values())
        if kind in ("fake_citation", "unretrieved_citation"):
            assert verification.endswith("never retrieved."), (kind, verification)
            assert verification[1:].split("]")[0] not in sources
            ungrounded.append(mean / len(d.meta["rubric"][0]))
        elif kind == "good":
            assert verification.endswith("] retrieved.") and verification[1:].split("]")[0] in sources
            grounded.append(mean / len(d.meta["rubric"][0]))
        seen.add(kind)
    assert "good" in seen and len(seen) >= 3
    if ungrounded:
        assert min(grounded) > max(ungrounded)
    # the joint protocol's demos still hold K reports
    joint, _ = build_demos(tokenizer, bm25, queries, replace(BUDGETS, scoring="joint"), 0, 0, 4, seed=3, base_state=BASE)
    assert joint and all(d.meta["num_reports"] >= 2 for d in joint)


def test_demos_are_deterministic_and_prompts_are_the_rl_prompts(tokenizer, bm25, queries):
    a, _ = build_demos(tokenizer, bm25, queries, BUDGETS, 3, 3, 1, seed=7, base_state=BASE)
    b, _ = build_demos(tokenizer, bm25, queries, BUDGETS, 3, 3, 1, seed=7, base_state=BASE)
    c, _ = build_demos(tokenizer, bm25, queries, BUDGETS, 3, 3, 1, seed=8, base_state=BASE)
    assert [(d.prompt_ids, d.response_ids, d.response_mask) for d in a] == [
        (d.prompt_ids, d.response_ids, d.response_mask) for d in b]
    assert [d.response_ids for d in a] != [d.response_ids for d in c]
    msgs = [{"role": "user", "content": "hi"}]
    enc = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    assert encode_chat(tokenizer, msgs) == list(enc["input_ids"] if hasattr(enc, "keys") else enc)


def test_budgets_are_tiny_scores():
    """The demos are checked against what tiny_score's RL samples; a config change must update both."""
    from helpers import compose

    tiny = compose(["experiment=tiny_score"])
    assert demo_budgets(tiny.solver, tiny.evaluator) == BUDGETS


def test_the_embedded_default_runs_the_cold_start_then_rl():
    from helpers import compose, recipe

    cfg = compose(["experiment=tiny_score"])
    assert cfg.sft.enabled and cfg.trainer.max_steps >= 20 and cfg.reward.require_citation
    assert not compose([*recipe("qwen_score")]).sft.enabled  # instruct models need no format cold start


def test_random_states_and_weight_plans_are_always_feasible():
    import random

    from score_lightning.sft.rubric_demos import random_rubric

    rng = random.Random(0)
    for _ in range(300):
        st = random_state(rng, BASE, 2)
        dc = st.dimension_constraints
        assert weight_plans(dc.k, dc.weight_min, dc.weight_max)
        assert check_rubric(random_rubric(rng, st, explore=list(st.dimension_pool)[:2]), st) == ""


@pytest.mark.parametrize("checkpointing", [False, True])
def test_shared_prompt_loss_and_gradients_equal_separate_rows(demos, tiny_ckpt, tokenizer, checkpointing):
    """Also under gradient checkpointing (every real model's setting), where HF drops a key/value cache
    inside the checkpointed layers: the earlier shared path trained the responses without their prompt."""
    from score_lightning.policy.models import load_policy
    from score_lightning.sft.module import SFTModule, group_demos

    model = load_policy(tiny_ckpt, gradient_checkpointing=checkpointing)
    if checkpointing:  # HF recomputes layers only in training mode
        assert model.training
    groups = [g for g in group_demos(demos) if len(g.responses) > 1]
    picked = [next(g for g in groups if g.kind == kind) for kind in (SOLVER, RUBRIC, SCORING)]
    results = []
    for shared in (True, False):
        module = SFTModule(model, tokenizer.pad_token_id, shared_prompt=shared, prompt_loss_weight=0.5)
        model.zero_grad()
        loss, stats, n = module.step_loss(picked)
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results.append((float(loss), stats["sft/token_acc"], n, grads))
    (l1, a1, n1, g1), (l2, a2, n2, g2) = results
    assert n1 == n2 == sum(g.num_trained for g in picked)
    assert l1 == pytest.approx(l2, rel=1e-5) and a1 == pytest.approx(a2)
    assert torch.allclose(g1, g2, rtol=1e-4, atol=1e-6)


class _Teacher(torch.nn.Module):
    """A stand-in language model: position t puts all its mass on the true token t + 1 (``oracle``), or
    spreads it evenly (not ``oracle``)."""

    def __init__(self, vocab: int, oracle: bool):
        super().__init__()
        self.vocab, self.oracle = vocab, oracle

    def forward(self, input_ids):
        from types import SimpleNamespace

        logits = torch.zeros(*input_ids.shape, self.vocab)
        if self.oracle:
            logits[0, torch.arange(input_ids.shape[1] - 1), input_ids[0, 1:]] = 50.0
        return SimpleNamespace(logits=logits)


def test_scoring_demo_fit_reads_each_value_and_verification_start(tokenizer, bm25, queries):
    from score_lightning.sft.context import DemoContext
    from score_lightning.sft.demo_fit import scoring_demo_fit

    ctx = DemoContext.create(tokenizer, bm25, queries, BUDGETS, BASE)
    oracle = scoring_demo_fit(_Teacher(len(tokenizer), True), tokenizer, ctx, 12)
    uniform = scoring_demo_fit(_Teacher(len(tokenizer), False), tokenizer, ctx, 12)
    assert oracle.keys() == uniform.keys() and len(oracle) >= 3
    assert sum(f["n_values"] for f in oracle.values()) >= 12 * 2  # one report (pointwise) x >= 2 dimensions per demo
    for kind, f in oracle.items():
        # the oracle predicts each demo value exactly and every verification's opening
        assert f["model_value"] == pytest.approx(f["target_value"], abs=1e-3), kind
        assert f["verification_start_acc"] == 1.0 or f["n_verifications"] == 0, kind
        # even digit mass: expected value 4.5; argmax of a flat row is token 0, never the demo's
        assert uniform[kind]["model_value"] == pytest.approx(4.5, abs=1e-4)
        assert uniform[kind]["verification_start_acc"] == 0.0 or uniform[kind]["n_verifications"] == 0
    if "empty" in oracle:  # a missing report scores 0 on every dimension
        assert oracle["empty"]["target_value"] == 0.0
    if "good" in oracle:
        assert oracle["good"]["target_value"] >= 8.0


def test_contrast_scoring_groups_are_one_report_and_its_minimal_edits(tokenizer, bm25, queries, monkeypatch):
    """``sft.scoring_contrast=1``: every joint scoring prompt holds a good report and edits of that very report
    (the same searches and words, one flaw each), and the scores rank the good one above each flawed one;
    at 0 the scoring demos are the ones built before the knob (the same random stream)."""
    import dataclasses
    import random
    import re

    import score_lightning.sft.scoring_demos as S
    from score_lightning.sft.context import DemoContext

    joint = dataclasses.replace(BUDGETS, scoring="joint", show_retrieved=False)
    ctx = DemoContext.create(tokenizer, bm25, queries, joint, BASE)
    made: list[tuple[str, str]] = []
    real = S._report

    def record(ctx, rng, query, rubric, kind):
        text, feat = real(ctx, rng, query, rubric, kind)
        made.append((feat["kind"], text))
        return text, feat

    monkeypatch.setattr(S, "_report", record)
    checked = 0
    for seed in range(6):
        made.clear()
        ds = S.scoring_group(ctx, random.Random(seed), queries[seed], 1, contrast=1.0)
        if not ds:
            continue
        kinds = [k for k, _ in made]
        assert "good" in kinds and len(set(kinds)) >= 2, kinds
        good = next(t for k, t in made if k == "good")
        assert all(t == good for k, t in made if k == "good")  # one report, repeated where drawn twice
        for k, t in made:
            if k == "no_citation":
                assert t == re.sub(r"\s*\[[^\]\s]+\]", "", good).replace("According to ,", "According to the docs,")
            if k in ("fake_citation", "unretrieved_citation"):
                assert t != good and len(t.split()) == len(good.split())  # one id swapped, nothing else
            if k == "truncated":
                assert good.startswith(t)
        ev = parse_evaluation(_model_text(tokenizer, ds[0]), Rubric(*ds[0].meta["rubric"]), len(kinds))
        mean = {i: sum(r.scores.values()) for i, r in ev.reports.items()}
        top = [mean[i] for i, k in enumerate(ds[0].meta["kinds"], 1) if k == "good"]
        flawed = [mean[i] for i, k in enumerate(ds[0].meta["kinds"], 1) if k in ("no_citation", "off_topic", "fake_citation")]
        assert all(min(top) > f for f in flawed)
        checked += 1
    assert checked >= 4
    monkeypatch.setattr(S, "_report", real)
    before = S.scoring_group(ctx, random.Random(7), queries[0], 2)
    after = S.scoring_group(ctx, random.Random(7), queries[0], 2, contrast=0.0)
    assert [(d.prompt_ids, d.response_ids) for d in before] == [(d.prompt_ids, d.response_ids) for d in after]
