"""The packaged preference pairs (data/assets/preferences.jsonl): rebuilt bit for bit, ordered by verifiable
item_recall, split 8:1:1 by question on training questions only; and experiment=preference_tiny trains on them."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import defaultdict

from helpers import FAST, ROOT, read_scalars, train
from score_lightning.data.items import EMBEDDED_ITEMS_PATH, load_items, text_digest
from score_lightning.rewards.citations import cited_ids
from score_lightning.rewards.items import item_recall
from score_lightning.methods.preference.reward import load_preferences
from score_lightning.methods.preference.pairs import build_pairs, pairs_text

PACKAGED = EMBEDDED_ITEMS_PATH.with_name("preferences.jsonl")


def test_the_packaged_pairs_rebuild_bit_for_bit(tmp_path):
    out = tmp_path / "pairs.jsonl"
    proc = subprocess.run([sys.executable, "scripts/build_preferences.py", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert out.read_bytes() == PACKAGED.read_bytes()
    manifest = json.loads(PACKAGED.with_name("preferences.manifest.json").read_text())
    assert manifest["digest"] == text_digest(PACKAGED.read_text(encoding="utf-8"))
    assert proc.stdout.strip().splitlines()[-1] == (f"pairs=78 train=62 val=8 test=8 digest={manifest['digest']}")


def test_the_chosen_report_satisfies_more_items_by_the_verifier():
    items = load_items()
    pairs = [json.loads(line) for line in PACKAGED.read_text().splitlines()]
    assert pairs_text(build_pairs(list(items.values()))) == PACKAGED.read_text(encoding="utf-8")
    splits = defaultdict(set)
    for p in pairs:
        q = items[p["query_id"]]
        assert q.extra.get("split") == "train"  # no held-out question of the card
        splits[p["query_id"]].add(p["split"])
        got = []
        for side in ("chosen", "rejected"):
            text = p[side]
            got.append(item_recall(q.items, text, cited_ids(text), True))
        assert [round(g, 4) for g in got] == [p["chosen_recall"], p["rejected_recall"]] and got[0] > got[1], p["id"]
        assert len(p["chosen"].split()) - len(p["rejected"].split()) < 3 * len(q.items) * 6  # same shape, same ids
        assert sorted(cited_ids(p["chosen"])) == sorted(cited_ids(p["rejected"]))
    assert all(len(s) == 1 for s in splits.values())  # a question sits in one split
    per = defaultdict(int)
    for s in splits.values():
        per[next(iter(s))] += 1
    assert dict(per) == {"train": 31, "val": 4, "test": 4}  # 32 training questions; one has no verifiable pair
    assert len([p for p in load_preferences(PACKAGED) if p.get("split") == "train"]) == 62


def test_preference_tiny_runs_a_step(tmp_path, tiny_ckpt):
    out = tmp_path / "run"
    train(["experiment=preference_tiny", *FAST[1:], "rollout=scripted", "trainer.max_steps=1",
           "solver.max_response_tokens=200", "evaluator.max_response_tokens=500", "evaluator.max_rubric_tokens=160",
           f"paths.output_dir={out}"])
    scalars = read_scalars(out / "tensorboard")
    assert [s for s, _ in scalars["evaluator/reward"]] == [0]
    assert all(0.0 <= v <= 1.0 for _, v in scalars["evaluator/reward"])  # the step's mean agreement
    assert all(math.isfinite(v) for _, v in scalars["evaluator/rubric_logprob"])


def test_a_held_out_split_becomes_a_bench_evaluator_pair_set(tmp_path):
    """``--pair-set test``: the held-out preference pairs as bench_evaluator pairs (valid kind, the chosen side better,
    positions alternating), digest-checked on read like any stored pair set."""
    from score_lightning.evaluation.pair_set import read_pair_set

    proc = subprocess.run([sys.executable, "scripts/build_preferences.py", "--out", str(tmp_path / "p.jsonl"),
                           "--pair-set", "test"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    pairs, manifest = read_pair_set(tmp_path / "preferences_test_pairs.jsonl")
    source = [json.loads(line) for line in PACKAGED.read_text().splitlines() if json.loads(line)["split"] == "test"]
    assert manifest["split"] == "test" and len(pairs) == len(source) == 8
    assert [p.better for p in pairs] == [0, 1] * 4 and all(p.kind == "valid" for p in pairs)
    for p, s in zip(pairs, source):
        assert p.sides[p.better].text == s["chosen"] and p.sides[p.worse].text == s["rejected"]
        assert p.sides[p.better].item_recall > p.sides[p.worse].item_recall
    # heldout: val and test, the 16 pairs no training step draws, over 8 questions
    proc = subprocess.run([sys.executable, "scripts/build_preferences.py", "--out", str(tmp_path / "p.jsonl"),
                           "--pair-set", "heldout"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    held, manifest = read_pair_set(tmp_path / "preferences_heldout_pairs.jsonl")
    source = [json.loads(line) for line in PACKAGED.read_text().splitlines() if json.loads(line)["split"] != "train"]
    assert manifest["split"] == "heldout" and len(held) == len(source) == 16
    assert {p.query_id for p in held} == {s["query_id"] for s in source} and len({s["query_id"] for s in source}) == 8
