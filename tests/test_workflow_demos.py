"""Cold-start demonstrations of the solver workflows: valid formats within the RL budgets, added only when
the config uses them, and leaving the default cold start (its demos and its cache key) untouched."""

from __future__ import annotations

import pytest

from helpers import compose
from score_lightning.methods.mams import prompts as M
from score_lightning.roles.answer import parse_answer
from score_lightning.methods.arco.judge import parse_step_judgement
from score_lightning.rollout.agent import parse_search_action
from score_lightning.sft.demo_types import demo_budgets
from score_lightning.sft.demos import build_demos
from score_lightning.sft.workflow_demos import workflow_demo_spec, workflow_key_inputs, workflow_kinds


@pytest.fixture(scope="module")
def queries():
    from score_lightning.data.queries import load_queries

    return [q.prompt for q in load_queries(None, split="train")]


def test_workflow_demos_only_where_the_config_uses_them():
    base = compose(["experiment=tiny_score"])
    assert workflow_demo_spec(base) is None and workflow_kinds(None) == []
    assert workflow_key_inputs(base) == {}  # the default cold start's cache key is unchanged
    mams, arco = compose(["experiment=mams_tiny"]), compose(["experiment=arco_tiny"])
    m, a = workflow_demo_spec(mams), workflow_demo_spec(arco)
    assert (m["num_mams"], m["num_step"], a["num_mams"], a["num_step"]) == (240, 0, 0, 480)
    assert m["mams"].max_searches == int(mams.solver.max_tool_calls) and a["mams"] is None
    assert workflow_key_inputs(mams) != workflow_key_inputs(arco) != {}
    assert [k.kind for k in workflow_kinds(m)] == ["mams"] and [k.kind for k in workflow_kinds(a)] == ["step"]


def test_workflow_demos_are_valid_and_leave_the_default_kinds_unchanged(tokenizer, bm25, queries):
    cfg = compose(["experiment=mams_tiny", "reward.step=rubric"])
    spec = workflow_demo_spec(cfg)
    extra = [type(k)(k.kind, 6, k.per_prompt, k.group) for k in workflow_kinds(spec)]
    budgets = demo_budgets(cfg.solver, cfg.evaluator)
    plain, _ = build_demos(tokenizer, bm25, queries, budgets, 4, 8, 2, seed=3)
    demos, stats = build_demos(tokenizer, bm25, queries, budgets, 4, 8, 2, seed=3, extra=extra)
    assert [(d.prompt_ids, d.response_ids) for d in demos[:len(plain)]] == [(d.prompt_ids, d.response_ids) for d in plain]
    new = demos[len(plain):]
    kinds = {d.kind for d in new}
    assert kinds == {"mams_search", "mams_state", "mams_report", "step"} and stats.built["mams"] > 0
    mams = spec["mams"]
    budget = {"mams_search": mams.search_tokens, "mams_state": mams.state_tokens,
              "mams_report": mams.report_tokens, "step": spec["step_max_tokens"]}
    for d in new:
        text = tokenizer.decode(d.response_ids[:-1])  # without the appended EOS
        assert d.response_ids[-1] == tokenizer.eos_token_id and d.response_mask == [1] * len(d.response_ids)
        assert len(d.response_ids) - 1 < budget[d.kind], d.kind
        if d.kind.startswith("mams_"):
            assert len(d.prompt_ids) <= mams.max_context_tokens
        if d.kind == "mams_search":
            assert text == M.FINISH or parse_search_action(text).kind == "search", text
        elif d.kind == "mams_state":
            assert M.parse_state(text).valid, text
        elif d.kind == "mams_report":
            answer = parse_answer(f"<answer>{M.parse_report(text)}</answer>", require_citation=True)
            assert answer.valid and answer.answer.splitlines()[-1].startswith("Conclusion:"), text
        else:
            assert parse_step_judgement(text).valid, text
    reports = [d for d in new if d.kind == "mams_report"]
    assert all(d.meta["search_queries"] for d in reports)


def test_item_writing_demos_for_rler_and_drrubric_are_valid_and_shared(tokenizer, bm25, queries):
    """rubric=evolving and rubric=drrubric get the same four item-writing kinds (one cold start for both), each in
    the exact prompt its rubric source sends, every response parsing to items that cite what the prompt showed."""
    from score_lightning.methods.rler.items import ITEMS_SYSTEM, parse_items
    from score_lightning.methods.rler.research_prompts import DISTIL_SYSTEM, RESEARCH_SYSTEM, findings_text

    rler, dr = compose(["experiment=rler_tiny"]), compose(["experiment=drrubric_tiny"])
    spec = workflow_demo_spec(rler)
    assert spec == workflow_demo_spec(dr) and spec["num_items"] == 240
    assert workflow_key_inputs(rler) == workflow_key_inputs(dr) != {}
    extra = [type(k)(k.kind, 8, k.per_prompt, k.group) for k in workflow_kinds(spec)]
    demos, stats = build_demos(tokenizer, bm25, queries, demo_budgets(rler.solver, rler.evaluator), 0, 0, 0, seed=5,
                               extra=extra)
    by_kind = {k: [d for d in demos if d.kind == k] for k in ("items_init", "items_contrast", "research", "distil")}
    assert all(len(v) >= 4 for v in by_kind.values()), {k: len(v) for k, v in by_kind.items()}
    for kind, ds in by_kind.items():
        for d in ds:
            prompt, text = tokenizer.decode(d.prompt_ids), tokenizer.decode(d.response_ids[:-1])
            assert d.response_ids[-1] == tokenizer.eos_token_id
            system = {"research": RESEARCH_SYSTEM, "distil": DISTIL_SYSTEM}.get(kind, ITEMS_SYSTEM)
            assert system.split("\n", 1)[0] in prompt
            if kind == "research":  # searches with real observations (mask 0), then the notes
                assert 0 in d.response_mask and "<observation>" in text and findings_text(text)
                cited = [w for w in findings_text(text).split() if w.startswith("[")]
                assert cited and all(c.split("]")[0] + "]" in text.split("<findings>")[0] for c in cited)
                continue
            assert d.response_mask == [1] * len(d.response_ids)
            items = parse_items(text).items
            assert len(items) == d.meta["n_items"], text
            for it in items:  # a cited id is one the prompt showed
                if "[" in it.text:
                    doc = it.text.split("[", 1)[1].split("]", 1)[0]
                    assert f"[{doc}]" in prompt, (it.text, kind)
            if kind in ("items_init", "distil"):
                assert any(it.negative for it in items) and any("[" in it.text for it in items)


def test_rubricem_demos_are_valid_and_leave_the_item_writers_key_alone(tokenizer, bm25, queries):
    """RubricEM's four-stage trajectories and stage judgements, in the RL prompt formats; adding them changed no
    other workflow's key (the item writers' packaged cold start still matches: tests/test_cold_start_asset.py)."""
    from score_lightning.methods.rubricem.prompts import parse_stage_scores
    from score_lightning.methods.rubricem.stages import stage_spans

    cfg = compose(["experiment=rubricem_tiny"])
    spec = workflow_demo_spec(cfg)
    assert (spec["num_rubricem"], spec["num_stage"], spec["num_items"]) == (480, 480, 0)
    assert "num_rubricem" not in workflow_key_inputs(compose(["experiment=rler_tiny"]))["workflow_demos"]
    extra = [type(k)(k.kind, 8, k.per_prompt, k.group) for k in workflow_kinds(spec)]
    demos, _ = build_demos(tokenizer, bm25, queries, demo_budgets(cfg.solver, cfg.evaluator), 0, 0, 0, seed=4,
                           extra=extra)
    em = [d for d in demos if d.kind == "rubricem"]
    judge = [d for d in demos if d.kind == "stage_judge"]
    assert len(em) >= 4 and len(judge) >= 4
    for d in em:
        spans = stage_spans(d.response_ids[:-1], tokenizer.decode)
        assert set(spans) == {"plan", "research", "review", "answer"}, tokenizer.decode(d.response_ids)
        assert 0 in d.response_mask  # real observations, masked
    for d in judge:
        scores = parse_stage_scores(tokenizer.decode(d.response_ids[:-1]))
        assert scores is not None and all(abs(scores[k] * 10 - d.meta[k]) < 1e-9 for k in scores)
