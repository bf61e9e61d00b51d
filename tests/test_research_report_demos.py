"""``sft.report``: cold-start solver demos as research reports.

Several searches, then several findings, each a sentence of the text an observation actually showed and
cited with that passage's id; scoring demos show reports of the same shape; ``sft.report: null`` keeps
the packaged tiny cold start's key (its demos are pinned by ``test_cold_start_asset``).
"""

from __future__ import annotations

import re
from statistics import mean

import pytest

from helpers import compose
from score_lightning import protocol as P
from score_lightning.errors import ConfigError
from score_lightning.harness.state import HarnessState
from score_lightning.launch.config_validation import validate_config
from score_lightning.roles.answer import parse_answer
from score_lightning.rollout.agent import format_observation
from score_lightning.sft.cache import sft_key_inputs
from score_lightning.sft.demo_types import SCORING, SOLVER, ReportShape, demo_budgets, report_shape
from score_lightning.sft.demos import build_demos
from score_lightning.sft.research_report import round_robin_findings
from score_lightning.sft.solver_demos import visible_passages
from score_lightning.roles.text import _clean

#: smol_score's budgets (768 response tokens, 3 searches, 384-token reports, pointwise with sources shown)
SMOL = compose(["experiment=smol_score"])
BUDGETS = demo_budgets(SMOL.solver, SMOL.evaluator)
BASE = HarnessState.from_dict({"dimension_constraints": {"k": 3, "must_include": ["factual_support"],
                                                         "weight_min": 0.1, "weight_max": 0.6}})
SHAPE = ReportShape(claims=(3, 5), searches=(2, 3))
PER_PROMPT = {SOLVER: 4, "rubric": 1, SCORING: 2}


@pytest.fixture(scope="module")
def queries():
    from score_lightning.data.queries import load_queries

    return [q.prompt for q in load_queries(None)]


def _solver_demos(tokenizer, bm25, queries, report):
    demos, stats = build_demos(tokenizer, bm25, queries, BUDGETS, 24, 0, 32, seed=3, base_state=BASE,
                               per_prompt=PER_PROMPT, report=report)
    return demos, stats


@pytest.fixture(scope="module")
def reports(tokenizer, bm25, queries):
    return _solver_demos(tokenizer, bm25, queries, SHAPE)


def test_findings_go_round_the_passages_by_hand():
    passages = [("a", ["a1", "a2"]), ("b", ["b1"]), ("c", ["c1", "c2", "c3"])]
    assert round_robin_findings(passages, 5) == [("a", "a1"), ("b", "b1"), ("c", "c1"), ("a", "a2"), ("c", "c2")]
    assert round_robin_findings(passages, 10)[-1] == ("c", "c3") and len(round_robin_findings(passages, 10)) == 6
    assert round_robin_findings([], 3) == []


def test_visible_passages_state_only_what_the_observation_showed(tokenizer, bm25):
    hits = bm25.search(["json.dumps serialize"], 2)[0]
    ids, shown = format_observation(hits, 64, tokenizer)
    seen = _clean(tokenizer.decode(ids))
    got = visible_passages(tokenizer, hits, 64)
    assert got and {d for d, _ in got} <= set(shown)
    for _, sentences in got:
        for s in sentences:  # cleaned and capitalised, with a closing full stop added
            assert s[1:].rstrip(".") in seen, (s, seen)
    # a larger budget shows more of each passage, so at least as many sentences
    wide = dict(visible_passages(tokenizer, hits, 256))
    assert all(len(wide.get(d, [])) >= len(s) for d, s in got)


def test_report_demos_search_several_times_and_cite_several_retrieved_passages(reports, tokenizer, bm25, queries):
    demos, stats = reports
    solver = [d for d in demos if d.kind == SOLVER]
    assert stats.built[SOLVER] == 24 and len(solver) == 24
    for d in solver:
        text = tokenizer.decode([t for t, m in zip(d.response_ids, d.response_mask) if m])
        a = parse_answer(text, False, require_citation=True)
        assert a.valid, (a.reason, text)
        assert set(a.cited_ids) <= set(d.meta["retrieved_ids"])
        assert a.answer.rstrip().splitlines()[-1].startswith("Conclusion:")
        assert 2 <= d.meta["tool_calls"] <= 3 and len(d.response_ids) <= BUDGETS.solver_max_response_tokens
        assert text.count(P.SEARCH_OPEN) == d.meta["tool_calls"]
    cited = [len(set(re.findall(r"\[([^\]]+)\]", d.meta["answer"]))) for d in solver]
    assert mean(cited) >= 2.0 and min(cited) >= 1
    short, _ = _solver_demos(tokenizer, bm25, queries, None)
    words = lambda ds: mean(len(d.meta["answer"].split()) for d in ds if d.kind == SOLVER)  # noqa: E731
    assert words(solver) >= 2 * words(short), (words(solver), words(short))


def test_scoring_demos_show_reports_of_the_same_shape(reports, tokenizer):
    demos, _ = reports
    scoring = [d for d in demos if d.kind == SCORING]
    assert scoring
    full = [d for d in scoring if d.meta["kinds"][0] in ("good", "fake_citation", "unretrieved_citation")]
    assert full, [d.meta["kinds"] for d in scoring]
    for d in full:  # whole reports (not cut short, not a single finding): several cited findings and a conclusion
        prompt = tokenizer.decode(d.prompt_ids)
        report = prompt.split("[Report 1]", 1)[1]
        assert "Conclusion:" in report and len(re.findall(r"\[[^\]]+\]", report.split("\n", 2)[-1])) >= 2


def test_report_shape_from_config_and_its_refusals():
    assert report_shape(None) is None
    assert report_shape({"claims": [2, 4], "searches": [1, 1]}) == ReportShape((2, 4), (1, 1))
    with pytest.raises(ValueError, match="sft.report.claims"):
        report_shape({"claims": [4, 2], "searches": [1, 3]})
    with pytest.raises(ConfigError, match="sft.report"):
        validate_config(compose(["experiment=tiny_score", "sft.report={claims:[0,2],searches:[1,3]}"]))
    validate_config(compose(["experiment=tiny_score", "sft.report={claims:[3,5],searches:[1,3]}"]))


def test_a_null_report_leaves_the_key_and_a_shape_changes_it(tiny_ckpt, cache_dir):
    base = compose(["experiment=tiny_score", f"paths.cache_dir={cache_dir}"])
    assert base.sft.report is None and "report" not in sft_key_inputs(base, str(tiny_ckpt))["sft"]
    shaped = compose(["experiment=tiny_score", f"paths.cache_dir={cache_dir}",
                      "sft.report={claims:[3,5],searches:[1,3]}"])
    shaped_inputs, base_inputs = sft_key_inputs(shaped, str(tiny_ckpt)), sft_key_inputs(base, str(tiny_ckpt))
    assert shaped_inputs["sft"]["report"] == {"claims": [3, 5], "searches": [1, 3]}
    assert shaped_inputs["budgets"] == base_inputs["budgets"]  # the shape is keyed once, under sft, not as a budget
