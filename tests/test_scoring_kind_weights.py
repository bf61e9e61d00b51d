"""``sft.scoring_kind_weights``: the mix of report kinds the cold start's scoring demos show (issue 50's lever "a
larger share of uncited-report demonstrations"). The default draws exactly as before (every cold-start key, the
packaged ones included, unchanged); a mapping replaces the weights of the kinds it names; bad mappings are refused
by name."""

from __future__ import annotations

from collections import Counter

import pytest

from helpers import compose
from score_lightning.data.queries import load_queries
from score_lightning.sft.cache import sft_key_inputs
from score_lightning.sft.demo_types import KIND_WEIGHTS, SCORING_KINDS, demo_budgets, kind_weights
from score_lightning.sft.demos import build_demos
from score_lightning.sft.train import scoring_kind_weights


def test_a_mapping_replaces_only_the_kinds_it_names():
    assert kind_weights(None) == KIND_WEIGHTS == kind_weights({})
    w = dict(zip(SCORING_KINDS, kind_weights({"no_citation": 0.45, "empty": 0})))
    assert w == {"good": 0.3, "partial": 0.1, "no_citation": 0.45, "fake_citation": 0.05,
                 "unretrieved_citation": 0.1, "truncated": 0.05, "off_topic": 0.05, "empty": 0.0}


@pytest.mark.parametrize("bad,match", [({"uncited": 0.4}, r"unknown kind\(s\) \['uncited'\]"),
                                       ({"good": -0.1}, "must be >= 0"),
                                       ({k: 0 for k in SCORING_KINDS}, "not all 0")])
def test_bad_weights_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        kind_weights(bad)


def _kinds(demos) -> Counter:
    return Counter(k for d in demos for k in d.meta["kinds"])


def test_the_demos_draw_kinds_by_the_weights(tokenizer, bm25):
    cfg = compose(["experiment=tiny_score", "evaluator.scoring=pointwise"])
    queries = [q.prompt for q in load_queries(None)]
    budgets = demo_budgets(cfg.solver, cfg.evaluator)
    default, _ = build_demos(tokenizer, bm25, queries, budgets, 0, 0, 40, seed=4)
    same, _ = build_demos(tokenizer, bm25, queries, budgets, 0, 0, 40, seed=4, scoring_weights=KIND_WEIGHTS)
    assert [d.response_ids for d in default] == [d.response_ids for d in same]  # the default stream, bit for bit
    only = kind_weights({k: (1.0 if k == "no_citation" else 0.0) for k in SCORING_KINDS})
    uncited, _ = build_demos(tokenizer, bm25, queries, budgets, 0, 0, 40, seed=4, scoring_weights=only)
    assert set(_kinds(uncited)) == {"no_citation"} and sum(_kinds(uncited).values()) >= 30
    assert _kinds(default)["no_citation"] < 0.5 * sum(_kinds(default).values())


def test_the_knob_enters_the_key_only_when_set_and_is_validated(tiny_ckpt):
    from score_lightning.launch.config_validation import validate_config

    base = compose(["experiment=tiny_score"])
    assert scoring_kind_weights(base.sft) is None
    assert "scoring_kind_weights" not in sft_key_inputs(base, str(tiny_ckpt))["sft"]
    on = compose(["experiment=tiny_score", "sft.scoring_kind_weights={no_citation:0.45}"])
    assert dict(zip(SCORING_KINDS, scoring_kind_weights(on.sft)))["no_citation"] == 0.45
    assert sft_key_inputs(on, str(tiny_ckpt))["sft"]["scoring_kind_weights"] == {"no_citation": 0.45}
    validate_config(on)
    with pytest.raises(Exception, match="unknown kind"):
        validate_config(compose(["experiment=tiny_score", "sft.scoring_kind_weights={uncited:0.4}"]))
