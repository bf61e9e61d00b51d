"""The held-out card over sampled answers: per-query means, the query bootstrap, old files, and the
settings rule of ``compare_cards`` / ``evaluate.py card --baseline``."""

from __future__ import annotations

import json

import pytest

from score_lightning.evaluation import main
from score_lightning.evaluation.card import (
    CardMismatch,
    bootstrap_ci,
    compare_cards,
    load_card,
    normalise_card,
    report_card,
)
from score_lightning.retrieval.base import SearchHit

SETTINGS = {"solver.max_tool_calls": 3, "solver.temperature": 1.0, "reward.citations": "retrieved"}


class Top:
    """Coverage's BM25 stand-in: the same top ids t0..t{k-1} for every query."""

    def search(self, queries, topk):
        return [[SearchHit(f"t{j}", "x", 1.0) for j in range(topk)] for _ in queries]


def _rec(qid, sample, article, grounded, retrieved=("t0",), valid=True, **extra):
    return {"id": qid, "sample": sample, "article": article, "retrieved_ids": list(retrieved),
            "valid_answer": valid, "grounded_valid": grounded, **extra}


def _write(tmp_path, articles, sources, name="a"):
    arts, srcs = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.jsonl.sources.jsonl"
    arts.write_text("".join(json.dumps(a) + "\n" for a in articles))
    srcs.write_text("".join(json.dumps(s) + "\n" for s in sources))
    return arts, srcs


def test_grounded_valid_is_the_per_query_mean_over_samples_then_a_query_bootstrap(tmp_path):
    arts = [{"id": 1, "prompt": "q1", "article": "sample zero [t0]"},
            {"id": 2, "prompt": "q2", "article": "two words"},
            {"id": 3, "prompt": "q3", "article": "legacy answer [t1]"}]
    srcs = [
        # query 1: 4 samples, 2 grounded-valid -> 0.5; sample 3 recorded twice, the last record counts
        _rec(1, 0, "sample zero [t0]", True), _rec(1, 1, "one [t0] [zz]", False),
        _rec(1, 2, "no citation here", False, valid=False), _rec(1, 3, "stale", True),
        _rec(1, 3, "cites [t0] [t1]", True, retrieved=("t0", "t1")),
        # query 2: 2 samples, both valid -> 1.0
        _rec(2, 0, "two words", True, retrieved=()), _rec(2, 1, "a b [t2]", True, retrieved=("t2",)),
        # query 3: a record from before samples and grounded_valid: sample 0, its text in the article file,
        # valid format but citing an id it never retrieved -> 0
        {"id": 3, "retrieved_ids": ["t0"], "valid_answer": True, "cites_only_retrieved": False},
    ]
    card = report_card(*_write(tmp_path, arts, srcs), Top(), coverage_k=4, generation={"settings": SETTINGS, "samples": 4})
    rows = {r["id"]: r for r in card["per_query"]}
    assert [rows[i]["samples"] for i in (1, 2, 3)] == [4, 2, 1] and card["answers"] == 7
    assert [rows[i]["grounded_valid"] for i in (1, 2, 3)] == [0.5, 1.0, 0.0]
    assert rows[1]["format_valid"] == 0.75  # one of the four fails the format rule
    # precision over the cited samples only: 1, 1/2, (uncited), 1 -> 5/6; query 2: (uncited), 1 -> 1;
    # query 3 cites [t1] but retrieved only t0 -> 0
    assert rows[1]["citation_precision"] == pytest.approx(5 / 6) and rows[2]["citation_precision"] == 1.0
    assert rows[3]["citation_precision"] == 0.0
    assert rows[1]["coverage"] == pytest.approx((1 / 4 + 1 / 4 + 0 + 2 / 4) / 4)
    assert rows[1]["length"] == pytest.approx((3 + 3 + 3 + 3) / 4) and rows[2]["length"] == pytest.approx(2.5)
    assert rows[1]["citations"] == pytest.approx((1 + 2 + 0 + 2) / 4)  # distinct ids per answer
    assert card["uncited"] == 2
    g = card["summary"]["grounded_valid"]
    want = bootstrap_ci([0.5, 1.0, 0.0])  # the interval resamples queries, not answers
    assert g["mean"] == pytest.approx(0.5) and g["n"] == 3 and g["ci95"] == [want.low, want.high]
    assert g["ci95"][0] < 0.5 < g["ci95"][1]
    assert card["settings"] == SETTINGS and card["generation"] == {"samples": 4}


def test_compare_cards_gives_paired_differences_and_refuses_other_settings(tmp_path):
    def card(values, settings=SETTINGS):
        srcs = [_rec(i, k, f"answer [t0] {i}", v) for i, vs in values.items() for k, v in enumerate(vs)]
        arts = [{"id": i, "prompt": f"q{i}", "article": "x"} for i in values]
        return report_card(*_write(tmp_path, arts, srcs, name=str(len(srcs))), Top(), 2, {"settings": settings})

    run = card({1: [True, True], 2: [True, False], 3: [False, False]})  # 1.0, 0.5, 0.0
    cold = card({1: [False, True], 2: [False], 3: [False, False, False]})  # 0.5, 0.0, 0.0
    cmp = compare_cards(run, cold)
    g = cmp["metrics"]["grounded_valid"]
    assert g["card"] == pytest.approx(0.5) and g["baseline"] == pytest.approx(1 / 6)
    assert g["delta"] == pytest.approx(1 / 3) and g["n"] == 3 and cmp["queries"] == 3
    paired = bootstrap_ci([0.5, 0.5, 0.0])  # per-query differences, in id order
    assert g["ci95"] == pytest.approx([paired.low, paired.high])
    assert compare_cards(run, run)["metrics"]["grounded_valid"]["delta"] == 0.0
    assert compare_cards(cold, run)["metrics"]["grounded_valid"]["delta"] == pytest.approx(-1 / 3)

    hotter = card({1: [True], 2: [True], 3: [True]}, {**SETTINGS, "solver.temperature": 0.0, "solver.topk": 2})
    with pytest.raises(CardMismatch, match="solver.temperature") as err:
        compare_cards(run, hotter)
    assert err.value.keys == ["solver.temperature", "solver.topk"]
    with pytest.raises(CardMismatch) as err:  # a card without recorded settings cannot be vouched for
        compare_cards(run, {**run, "settings": None})
    assert err.value.keys == ["settings"]
    fewer = card({1: [True], 2: [True]})
    with pytest.raises(CardMismatch, match="different queries"):
        compare_cards(run, fewer)


def test_old_cards_read_with_the_new_names(tmp_path):
    old = {"queries": 1, "uncited": 0, "per_query": [{"id": 1, "validity": 1.0, "length": 3.0}],
           "summary": {"validity": {"mean": 1.0, "ci95": [1.0, 1.0], "n": 1}}}
    (tmp_path / "old.card.json").write_text(json.dumps(old))
    card = load_card(tmp_path / "old.card.json")
    assert card["summary"]["format_valid"]["mean"] == 1.0 and "validity" not in card["summary"]
    assert card["per_query"][0]["format_valid"] == 1.0 and card["settings"] is None
    assert normalise_card(card) == card


def test_card_cli_baseline_prints_differences_and_exits_2_on_other_settings(tmp_path, corpus_file, cache_dir, capsys):
    arts, _ = _write(tmp_path, [{"id": 1, "prompt": "json dumps", "article": "x [t0]"}],
                     [_rec(1, 0, "x [t0]", True), _rec(1, 1, "y [t0]", False)], name="run")
    (tmp_path / "run.jsonl.settings.json").write_text(json.dumps({"settings": SETTINGS, "samples": 2}))
    common = ["--corpus", str(corpus_file), "--index-dir", str(cache_dir / "bm25")]
    assert main(["card", "--articles", str(arts), *common]) == 0
    mine = json.loads((tmp_path / "run.card.json").read_text())
    assert mine["summary"]["grounded_valid"]["mean"] == 0.5 and mine["settings"] == SETTINGS

    base = {**mine, "per_query": [{**mine["per_query"][0], "grounded_valid": 0.25}],
            "summary": {**mine["summary"], "grounded_valid": {"mean": 0.25, "ci95": [0.25, 0.25], "n": 1}}}
    (tmp_path / "base.card.json").write_text(json.dumps(base))
    capsys.readouterr()
    assert main(["card", "--articles", str(arts), *common, "--baseline", str(tmp_path / "base.card.json")]) == 0
    out = capsys.readouterr().out
    assert "| grounded_valid | 0.500 | 0.250 | 0.250 [0.250, 0.250] | 1 |" in out  # 0.5 - 0.25, one query

    (tmp_path / "base.card.json").write_text(json.dumps({**base, "settings": {**SETTINGS, "solver.temperature": 0.0}}))
    assert main(["card", "--articles", str(arts), *common, "--baseline", str(tmp_path / "base.card.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot compare") and "solver.temperature (1.0 this, 0.0 baseline)" in err
    assert "Traceback" not in err


def test_item_recall_by_hand_and_cards_on_other_item_sets_are_refused(tmp_path):
    """item_recall: per sample the share of the query's items satisfied (0 unless grounded-valid), the query's
    mean over samples; queries without items (or with another prompt) have none; another item set is refused."""
    from score_lightning.data.items import EvidenceItem, QueryItems

    items = {"1": QueryItems("1", "q1", [EvidenceItem("a", ("t0",), ("alpha",)), EvidenceItem("b", ("t1",), ("beta",))]),
             "2": QueryItems("2", "another prompt", [EvidenceItem("a", ("t0",), ())])}
    arts = [{"id": 1, "prompt": "q1", "article": "x"}, {"id": 2, "prompt": "q2", "article": "y"}]
    srcs = [_rec(1, 0, "alpha [t0] and beta [t1]", True, retrieved=("t0", "t1")),  # both items: 1
            _rec(1, 1, "alpha [t0] and beta [t1]", True, retrieved=("t0",)),  # [t1] never retrieved: 1/2
            _rec(1, 2, "alpha [t0] and beta [t1]", False, retrieved=("t0", "t1")),  # not grounded-valid: 0
            _rec(1, 3, "alpha and beta [t0]", True, retrieved=("t0", "t1")),  # beta's passage not cited: 1/2
            _rec(2, 0, "y [t0]", True)]
    ident = {"path": "items.jsonl", "digest": "sha256:aa"}
    card = report_card(*_write(tmp_path, arts, srcs), Top(), 2, {"settings": SETTINGS}, items, ident)
    rows = {r["id"]: r for r in card["per_query"]}
    assert rows[1]["item_recall"] == pytest.approx((1 + 0.5 + 0 + 0.5) / 4)
    assert rows[2]["item_recall"] is None  # its items were written for another prompt
    assert card["summary"]["item_recall"]["n"] == 1 and card["items"] == ident
    assert compare_cards(card, card)["metrics"]["item_recall"]["delta"] == 0.0
    other = {**card, "items": {"path": "items.jsonl", "digest": "sha256:bb"}}
    with pytest.raises(CardMismatch, match="different item sets") as err:
        compare_cards(card, other)
    assert err.value.keys == ["items"]
    with pytest.raises(CardMismatch, match="different item sets"):
        compare_cards(card, {**card, "items": None})


def test_card_cli_scores_item_recall_on_the_embedded_items(tmp_path, corpus_file, cache_dir):
    from score_lightning.data.items import EMBEDDED_ITEMS_PATH, file_digest, load_items

    entry = load_items()["q003"]
    it = entry.items[0]
    answer = f"The documentation: {' '.join(it.terms)} [{it.evidence[0]}]. Conclusion: done."
    arts, _ = _write(tmp_path, [{"id": "q003", "prompt": entry.prompt, "article": answer}],
                     [_rec("q003", 0, answer, True, retrieved=it.evidence)], name="held")
    common = ["--corpus", str(corpus_file), "--index-dir", str(cache_dir / "bm25")]
    assert main(["card", "--articles", str(arts), *common]) == 0
    card = json.loads((tmp_path / "held.card.json").read_text())
    satisfied = sum(bool(set(x.evidence) & set(it.evidence)) and all(t in it.terms for t in x.terms)
                    for x in entry.items)  # items citing the same passage with terms the answer states
    assert satisfied >= 1
    assert card["summary"]["item_recall"]["mean"] == pytest.approx(satisfied / len(entry.items))
    assert card["items"] == {"path": "embedded", "digest": file_digest(EMBEDDED_ITEMS_PATH)}
    assert main(["card", "--articles", str(arts), *common, "--items", "none", "--out", str(tmp_path / "n.json")]) == 0
    assert json.loads((tmp_path / "n.json").read_text())["summary"]["item_recall"]["n"] == 0
