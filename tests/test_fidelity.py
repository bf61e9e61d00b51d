"""Switches and constraints that must mean what they say, on real runs with the scripted engine."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file

from helpers import FAST, compose, read_scalars
from score_lightning.harness.state import HarnessState

SCRIPTED = ["rollout=scripted", "solver.num_rollouts=3", "solver.max_response_tokens=200",
            "evaluator.max_response_tokens=400", "evaluator.max_rubric_tokens=160", "optim.lr=1e-3"]


def _run(out: Path, extra: list[str]):
    from score_lightning.launch.training import run

    box = {}
    run(compose(FAST + SCRIPTED + [f"paths.output_dir={out}"] + extra), module_hook=lambda m: box.setdefault("m", m))
    return box["m"]


def test_frozen_solver_stays_bitwise_while_the_separate_evaluator_learns(tmp_path, tiny_ckpt):
    start = load_file(next(Path(tiny_ckpt).glob("*.safetensors")))
    module = _run(tmp_path / "frozen", ["trainer.max_steps=3", "solver.freeze=true", "actor.shared=false"])
    end = load_file(next((tmp_path / "frozen" / "export").glob("*.safetensors")))
    assert all(torch.equal(start[k], end[k]) for k in start), "the frozen solver moved"
    evaluator = {k: v.detach() for k, v in module.evaluator_policy.state_dict().items()}
    moved = max(float((evaluator[k] - start[k]).abs().max()) for k in start)
    assert moved > 1e-4, "the evaluator did not learn: the freeze check would be vacuous"
    updated = read_scalars(tmp_path / "frozen" / "tensorboard")["evaluator/updated"]
    assert [v for _, v in updated] == [1.0, 1.0, 1.0]


def test_numeric_corpus_ids_are_cited_and_citation_validity_is_finite(tmp_path, corpus_file, tiny_ckpt):
    numeric = tmp_path / "wiki_like.jsonl"
    with open(corpus_file) as src, open(numeric, "w") as dst:
        for i, line in enumerate(src):
            if i == 400:
                break
            doc = json.loads(line)
            dst.write(json.dumps({"id": str(i), "contents": doc["contents"]}) + "\n")  # Search-R1 style ids
    _run(tmp_path / "num", ["trainer.max_steps=1", f"retriever.corpus_path={numeric}",
                            f"retriever.index_dir={tmp_path / 'bm25'}", "reward.require_citation=true"])
    scalars = read_scalars(tmp_path / "num" / "tensorboard")
    validity = [v for _, v in scalars["solver/citation_validity"]]
    assert validity and all(math.isfinite(v) for v in validity) and validity[0] == 1.0
    assert scalars["solver/answer_valid_rate"][0][1] > 0  # cited numeric ids make answers valid


def test_statistics_window_follows_the_callback_period(tmp_path, tiny_ckpt):
    module = _run(tmp_path / "win", ["trainer.max_steps=1", "harness.every_n_steps=5",
                                     "callbacks.meta_harness.every_n_steps=3"])
    assert module.stats_window.steps.maxlen == 3
    stats = module.harness_stats()
    for key in ("entropy", "verification_depth_mean", "reward_mean", "verified_rate"):
        assert math.isfinite(stats[key]), key


def test_scheduler_follows_a_pool_edit(tiny_ckpt):
    from score_lightning.module import ScoreModule

    module = ScoreModule(compose(FAST), str(tiny_ckpt))
    module.scheduler.update_stats(["factual_support", "insight"], [0.7])
    pool = {"factual_support": "Claims are backed by evidence.", "novelty": "Says something new.",
            "insight": "Explains why."}
    module.harness_state = HarnessState.from_dict({"dimension_pool": pool}, base=module.harness_state)
    assert module.scheduler.pool == list(pool)
    assert module.scheduler.selected["factual_support"] == 1 and module.scheduler.selected["novelty"] == 0
    assert "comprehensiveness" not in module.scheduler.frequencies()
