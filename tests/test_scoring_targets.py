"""``sft.scoring_targets=items``: scoring demos whose valid reports' target scores follow their evidence-item recall
(issue 50's lever for an evaluator that ranks valid reports), against hand computations; the default leaves every
cold-start key (the packaged ones) unchanged."""

from __future__ import annotations

import re

import pytest

from helpers import compose
from score_lightning.sft.cache import sft_key_inputs
from score_lightning.sft.demo_types import demo_budgets
from score_lightning.sft.demos import build_demos
from score_lightning.sft.scoring_demos import recall_base
from score_lightning.sft.train import scoring_items

_SCORE_RE = re.compile(r'<score dim="([a-z_]+)" value="(\d+)"')


@pytest.mark.parametrize("recall,base", [(0.0, 5), (0.12, 5), (0.17, 6), (0.34, 6), (0.5, 7), (0.67, 8), (1.0, 9)])
def test_recall_base_by_hand(recall, base):
    assert recall_base(recall) == base


def test_valid_reports_scores_follow_their_item_recall(tokenizer, bm25):
    cfg = compose(["experiment=tiny_score", "evaluator.scoring=pointwise", "sft.scoring_targets=items"])
    items = scoring_items(cfg.sft, cfg.reward)
    queries = [q for q in items][:12]
    demos, _ = build_demos(tokenizer, bm25, queries, demo_budgets(cfg.solver, cfg.evaluator), 0, 0, 60, seed=2,
                           items=items)
    checked, recalls = 0, set()
    for d in demos:
        (kind,), (recall,) = d.meta["kinds"], d.meta["recalls"]
        if kind not in ("good", "partial"):
            assert recall is None
            continue
        assert recall is not None
        scores = dict(_SCORE_RE.findall(tokenizer.decode(d.response_ids)))
        # a dimension no kind adjusts carries the base itself: 5 + round(4 x the share of the items satisfied)
        plain = [int(v) for dim, v in scores.items() if dim in ("clarity", "insight", "instruction_following")]
        for v in plain:
            assert v == recall_base(recall), (recall, scores)
            checked += 1
        recalls.add(recall)
    assert checked >= 5 and len(recalls) >= 2  # several valid reports, of different recall


def test_default_targets_leave_the_cold_start_keys_unchanged(tiny_ckpt):
    base = sft_key_inputs(compose(["experiment=tiny_score"]), str(tiny_ckpt))
    assert "scoring_targets" not in base["sft"] and "items" not in base
    on = sft_key_inputs(compose(["experiment=tiny_score", "sft.scoring_targets=items"]), str(tiny_ckpt))
    assert on["sft"]["scoring_targets"] == "items" and on["items"].startswith("sha256:")
    tiny = compose(["experiment=tiny_score"])
    assert scoring_items(tiny.sft, tiny.reward) is None


def test_an_unknown_target_is_refused_by_name():
    from score_lightning.launch.config_validation import validate_config

    with pytest.raises(Exception, match="sft.scoring_targets='recall'"):
        validate_config(compose(["experiment=tiny_score", "sft.scoring_targets=recall"]))
