"""The held-out split and the programmatic report card: disjoint ids, hand-checked scores, fixed CIs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import ROOT, compose
from score_lightning.data.queries import load_queries
from score_lightning.evaluation.card import bootstrap_ci, query_scores, report_card
from score_lightning.retrieval.base import SearchHit


def test_heldout_queries_are_never_trained_on(tiny_ckpt, tokenizer, bm25):
    train, held = load_queries(None, "train"), load_queries(None, "heldout")
    assert len(held) >= 20 and not {q.id for q in train} & {q.id for q in held}
    assert len(train) + len(held) == len(load_queries(None))
    held_text = {q.prompt for q in held}
    # the training stream (every batch of two epochs) only serves training ids
    from score_lightning.data.datamodule import QueryStream

    stream = QueryStream(load_queries(None, "train"), 4, 0)
    served = {i for n in range(2 * len(train) // 4) for i in stream.batch(n)["id"]}
    assert served == {q.id for q in train}
    # the tiny tokenizer's extra training text holds no held-out question
    from score_lightning.launch.training import tokenizer_extra_texts

    assert not held_text & set(tokenizer_extra_texts())
    # no cold-start demonstration's prompt mentions a held-out question
    from score_lightning.sft.train import build_sft_demos

    cfg = compose(["experiment=tiny_score", "sft.num_solver_demos=16", "sft.num_rubric_demos=64", "sft.num_scoring_demos=8"])
    demos, _ = build_sft_demos(cfg, tokenizer, bm25)
    prompts = [tokenizer.decode(d.prompt_ids) for d in demos]
    assert prompts and not any(q in p for q in held_text for p in prompts)


def test_query_scores_by_hand():
    src = {"retrieved_ids": ["a", "b", "c"], "valid_answer": True}
    s = query_scores("X is true [a]. Y [b] and Z [zz]. Also [a].", src, ["a", "d", "e", "f"])
    assert s["citation_precision"] == pytest.approx(2 / 3)  # a, b retrieved; zz not
    assert s["coverage"] == pytest.approx(1 / 4)  # only a of the top-4 is cited
    assert s["format_valid"] == 1.0 and s["length"] == 11.0  # words, citations included
    assert s["grounded_valid"] is None  # a record with neither grounded_valid nor cites_only_retrieved
    assert query_scores("no citations here", src, ["a"])["citation_precision"] is None
    # the record's own field wins; an older record combines the format rule with the grounding rule
    assert query_scores("x", {**src, "grounded_valid": False, "cites_only_retrieved": True}, [])["grounded_valid"] == 0.0
    assert query_scores("x", {**src, "cites_only_retrieved": True}, [])["grounded_valid"] == 1.0
    assert query_scores("x", {**src, "valid_answer": False, "cites_only_retrieved": True}, [])["grounded_valid"] == 0.0
    assert query_scores("x", {"retrieved_ids": []}, [])["format_valid"] is None


def test_bootstrap_ci_is_deterministic_and_brackets_the_mean():
    vals = [0.1, 0.4, 0.5, 0.9, 0.3, 0.7]
    a, b = bootstrap_ci(vals), bootstrap_ci(vals)
    assert a == b and a.low <= a.mean <= a.high and a.mean == pytest.approx(sum(vals) / 6)
    const = bootstrap_ci([0.5] * 10)
    assert const.low == const.high == const.mean == 0.5
    assert bootstrap_ci([None, None]).n == 0


def test_report_card_over_files(tmp_path):
    class Top:
        def search(self, queries, topk):
            return [[SearchHit(f"t{j}", "x", 1.0) for j in range(topk)] for _ in queries]

    arts, srcs = tmp_path / "a.jsonl", tmp_path / "a.jsonl.sources.jsonl"
    arts.write_text("\n".join(json.dumps({"id": i, "prompt": f"q{i}", "article": f"claim [t0] [t{i}]"}) for i in (1, 2)))
    srcs.write_text("\n".join(json.dumps({"id": i, "retrieved_ids": ["t0"], "valid_answer": i == 1}) for i in (1, 2)))
    card = report_card(arts, srcs, Top(), coverage_k=4)
    assert card["queries"] == 2
    assert card["summary"]["citation_precision"]["mean"] == pytest.approx(0.5)  # [t0] retrieved, [t1]/[t2] not
    assert card["summary"]["coverage"]["mean"] == pytest.approx(0.5)  # two of the top four cited, each
    assert card["summary"]["format_valid"]["mean"] == pytest.approx(0.5)
    # records from before grounded_valid and cites_only_retrieved: undefined, not 0
    assert card["summary"]["grounded_valid"]["n"] == 0 and card["settings"] is None


def test_evaluate_card_cli_on_heldout_queries(tmp_path, tiny_ckpt):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    out = tmp_path / "held.jsonl"
    gen = subprocess.run([sys.executable, "scripts/evaluate.py", "--model", str(tiny_ckpt), "--queries", "embedded",
                          "--split", "heldout", "--limit", "2", "--out", str(out), "--max-response-tokens", "48",
                          "--max-tool-calls", "1", "--no-progress"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert gen.returncode == 0, gen.stderr[-2000:]
    held = {q.id for q in load_queries(None, "heldout")}
    assert {json.loads(line)["id"] for line in out.read_text().splitlines()} <= held
    card = subprocess.run([sys.executable, "scripts/evaluate.py", "card", "--articles", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert card.returncode == 0, card.stderr[-2000:]
    assert "| grounded_valid |" in card.stdout and "| format_valid |" in card.stdout
    saved = json.loads((tmp_path / "held.card.json").read_text())
    assert saved["queries"] == 2 and saved["answers"] == 2
    assert saved["settings"]["solver.max_tool_calls"] == 1 and saved["settings"]["solver.temperature"] == 0.0
