"""``callbacks.evaluator_pairs``: the evaluator scores a stored pair set while it co-evolves (issue 50, point 2).

A real run (real model, retriever, trainer and updates; a scripted engine whose scores follow the report's text, so
the accuracies are known by hand) logs the probe's scalars to real TensorBoard event files at steps 0, 1 and 2,
and the probe leaves the run's random streams where they were.
"""

from __future__ import annotations

import json
import re
import sys

import pytest

from helpers import FAST, ROOT, compose, read_scalars
from score_lightning.evaluation.pair_build import Pair, Side
from score_lightning.evaluation.pair_set import write_pair_set
from score_lightning.rollout.engine import SamplingParams

DIMS = ("factual_support", "evidence_coverage", "citation_grounding")
RUBRIC = "<think>pick</think><dimensions>" + "".join(
    f'<dim name="{d}" weight="{w}"/>' for d, w in zip(DIMS, ("0.50", "0.30", "0.20"))) + "</dimensions>"
OBS_ID = re.compile(r"<observation>\[([^\]\s]+)\] ")
BOTH, ALPHA, NONE = "The passage covers alpha and beta.", "The passage covers alpha only.", "Nothing checked here."


def _respond(req):
    """Solver: one search, then a cited report; scoring: 9 for BOTH, 3 for ALPHA, 5 for NONE, 1 for no report."""
    if req.role == "rubric":
        return RUBRIC
    if req.role == "solver":
        if req.turn == 0:
            return "<think>look</think><search>" + " ".join(req.query.split()[:3]) + "</search>"
        return f"<answer>{BOTH} [{OBS_ID.search(req.context).group(1)}]\n\nConclusion: alpha and beta.</answer>"
    text = req.context.rsplit("Report 1", 1)[-1] if "Report 1" in req.context else req.context
    value = 9 if "alpha and beta" in text else 3 if "alpha only" in text else 5 if "Nothing checked" in text else 1
    scores = "".join(f'<score dim="{d}" value="{value}" reason="r"/>' for d in DIMS)
    return (f'<report_evaluations><report id="1"><verification>checked</verification><scores>{scores}</scores>'
            '</report></report_evaluations>')


def _pair_set(path, query_id: str, query: str) -> None:
    """Valid pairs BOTH > ALPHA (the scores agree) and ALPHA > NONE (they disagree: 3 < 5); one degraded pair,
    BOTH against no report (agree). By hand: valid_pair_acc 1/2, pair_acc 1."""
    def side(text, recall, edit="original"):
        return Side(text, ("json.loads",), text is not None, recall, int(recall * 2), len((text or "").split()), edit,
                    query_id, 0)

    pairs = [Pair(query_id, query, "valid", (side(BOTH, 1.0), side(ALPHA, 0.5)), 0),
             Pair(query_id, query, "valid", (side(NONE, 0.0), side(ALPHA, 0.5)), 1),
             Pair(query_id, query, "empty", (side(BOTH, 1.0), side(None, 0.0, "empty")), 0)]
    write_pair_set(path, pairs, {"seed": 0, "split": "train"})


def test_the_probe_logs_hand_computed_accuracies_and_leaves_the_random_streams(tmp_path, tiny_ckpt, corpus_file):
    import lightning as L
    import torch

    from score_lightning.data.queries import load_queries
    from score_lightning.launch.training import run
    from score_lightning.rollout.scripted import ScriptedEngine

    query = load_queries(None, split="train")[0]
    _pair_set(tmp_path / "pairs.jsonl", query.id, query.prompt)
    cfg = compose(FAST + [f"paths.output_dir={tmp_path / 'run'}", "trainer.max_steps=1", "optim.warmup_steps=0",
                          "harness.every_n_steps=10", "verifier.enabled=false", "solver.max_response_tokens=160",
                          "evaluator.max_response_tokens=200", "evaluator.max_rubric_tokens=96",
                          "evaluator.scoring=pointwise", f"callbacks.evaluator_pairs.pair_set={tmp_path / 'pairs.jsonl'}",
                          "callbacks.evaluator_pairs.every_n_steps=1"])
    streams = {}

    class Streams(L.Callback):  # the probe runs after this hook at a step's end (callbacks in config order first)
        def on_train_batch_end(self, trainer, module, *args):
            probe = next(c for c in trainer.callbacks if type(c).__name__ == "EvaluatorPairs")
            before = torch.get_rng_state()
            metrics = probe.measure(module)
            streams["same"] = torch.equal(before, torch.get_rng_state())
            streams["metrics"] = metrics

    class Drawing(ScriptedEngine):  # draws from the global streams, as a sampling engine does
        def generate(self, prompts, params):
            torch.rand(1)
            return super().generate(prompts, params)

    def install(module):
        module.engine = module.evaluator_engine = Drawing(module.tokenizer, _respond)

    run(cfg, extra_callbacks=[Streams()], module_hook=install)
    assert streams["same"]  # the probe generated (and drew), then put the stream back
    scalars = read_scalars(tmp_path / "run" / "tensorboard")
    assert [s for s, _ in scalars["evaluator/valid_pair_acc"]] == [0, 1]  # the cold start, then after the step
    assert all(v == pytest.approx(0.5) for _, v in scalars["evaluator/valid_pair_acc"])
    assert all(v == pytest.approx(1.0) for _, v in scalars["evaluator/pair_acc"])
    assert all(v == 3.0 for _, v in scalars["evaluator/pairs_scored"])
    assert "time/evaluator_pairs_s" in scalars and "evaluator/valid_pair_acc_lo" in scalars
    assert streams["metrics"]["evaluator/valid_pair_acc"] == pytest.approx(0.5)


def test_the_probe_is_refused_without_a_pair_set_and_on_a_changed_one(tmp_path):
    from hydra.utils import instantiate

    from score_lightning.launch.config_validation import ConfigError, validate_config

    on = ["experiment=tiny_score", "callbacks.evaluator_pairs.every_n_steps=5"]
    with pytest.raises(ConfigError, match="needs callbacks.evaluator_pairs.pair_set"):
        validate_config(compose(on))
    assert not instantiate(compose(["experiment=tiny_score"]).callbacks.evaluator_pairs).enabled  # off by default
    path = tmp_path / "pairs.jsonl"
    _pair_set(path, "q1", "A question?")
    validate_config(compose([*on, f"callbacks.evaluator_pairs.pair_set={path}"]))
    with pytest.raises(ConfigError, match="rollout.mode=async"):
        validate_config(compose([*on, f"callbacks.evaluator_pairs.pair_set={path}", "rollout.mode=async"]))
    path.write_text(path.read_text().replace("alpha only", "alpha, only"))
    with pytest.raises(ConfigError, match="not the pair set its manifest describes"):
        validate_config(compose([*on, f"callbacks.evaluator_pairs.pair_set={path}"]))


def test_bench_evaluator_builds_training_pair_sets_from_training_queries_only():
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_evaluator

    cfg = compose(["experiment=tiny_score"])
    train, held = bench_evaluator._queries(cfg, 0, "train"), bench_evaluator._queries(cfg, 0, "heldout")
    assert len(train) == 40 and len(held) == 20 and not {q for q, _ in train} & {q for q, _ in held}
    assert bench_evaluator._queries(cfg, 8, "train") == train[:8]
    args = bench_evaluator._args(["--split", "train", "--seed", "2"])
    assert args.split == "train" and json.dumps(args.split) == '"train"'


def test_the_probe_leaves_the_engines_stored_kv_caches_as_they_were(tmp_path, tiny_ckpt, corpus_file):
    """A real run on the HF engine: the probe's rubric and scoring prompts are stored while it runs, and gone after
    it, so the next step's prefill can only reuse what the run itself stored (the entries from before, kept)."""
    import lightning as L

    from score_lightning.data.queries import load_queries
    from score_lightning.launch.training import run
    from score_lightning.rollout.hf_engine import HFEngine

    query = load_queries(None, split="train")[0]
    _pair_set(tmp_path / "pairs.jsonl", query.id, query.prompt)
    cfg = compose(FAST + [f"paths.output_dir={tmp_path / 'run'}", "trainer.max_steps=1", "harness.every_n_steps=10",
                          "verifier.enabled=false", "evaluator.scoring=pointwise",
                          f"callbacks.evaluator_pairs.pair_set={tmp_path / 'pairs.jsonl'}",
                          "callbacks.evaluator_pairs.every_n_steps=1000"])
    seen = {}

    class Stores(L.Callback):
        def on_train_batch_end(self, trainer, module, *args):
            probe = next(c for c in trainer.callbacks if type(c).__name__ == "EvaluatorPairs")
            engine = module.evaluator_engine
            assert isinstance(engine, HFEngine)
            ids = module.tokenizer("the json module reads and writes data files", add_special_tokens=False)["input_ids"]
            engine.generate([ids], SamplingParams(4, 0.0))  # the run's own entry, stored before the probe
            store = engine.prefix_store
            before = (list(store.entries), store._weights)
            added, add = [], store.add
            store.add = lambda *a: added.append(1) or add(*a)  # noqa: E731 - count what the probe stores
            probe.measure(module)
            store.add = add
            seen.update(before=before, after=(list(store.entries), store._weights), added=len(added))

    run(cfg, extra_callbacks=[Stores()])
    (entries, weights), (after, after_weights) = seen["before"], seen["after"]
    assert seen["added"] > 0 and len(entries) >= 1  # the probe generated and stored its calls while it ran
    assert len(after) == len(entries) and all(a is b for a, b in zip(after, entries)) and after_weights == weights
