"""Dynamic sampling (solver.dynamic_sampling): the bound on draws, what is kept, the accounting, exact resume.

Real SCORE steps with the scripted engine: a query's group is informative (one cited report, one uncited:
rewards 1.x and 0) or not (both uncited: rewards 0, 0) by a fixed rule of its text, so every draw's
outcome is known before the run.
"""

from __future__ import annotations

import zlib

import pytest
import torch

from helpers import FAST, compose
from score_lightning.rollout.scripted import ScriptRequest
from test_grounded_rewards import RUBRIC, BatchRecordingEngine, Recorder, _report, _solver

CITED = "A report on the question, cited [{cite}]. Conclusion: alpha."
UNCITED = "A report on the question with no citation, long enough. Conclusion: beta."


def informative(query: str) -> bool:
    return zlib.crc32(query.encode()) % 3 == 0


def _responder(all_uninformative: bool):
    def respond(req: ScriptRequest) -> str:
        if req.role == "rubric":
            return RUBRIC
        if req.role == "solver":
            mixed = informative(req.query) and not all_uninformative
            return _solver(req, {0: CITED if mixed else UNCITED, 1: UNCITED})
        if req.turn == 0:
            return "<search>verify the cited claim</search>"
        return "<report_evaluations>" + _report(1, (6, 6, 6)) + "</report_evaluations>"
    return respond


def _run(out, overrides, respond, ckpt=None):
    from score_lightning.launch.training import run

    cfg = compose(FAST + [f"paths.output_dir={out}", "optim.warmup_steps=0", "harness.every_n_steps=10",
                          "verifier.min_search_depth=1", "solver.max_response_tokens=160",
                          "evaluator.max_response_tokens=400", "evaluator.max_rubric_tokens=96",
                          "reward.require_citation=true", "data.batch_size=2", "optim.mini_batch_size=2",
                          "optim.micro_batch_size=4", "solver.dynamic_sampling.enabled=true",
                          "callbacks.model_checkpoint.every_n_steps=1", *overrides]
                  + ([f"ckpt_path={ckpt}"] if ckpt else []))
    rec, drawn = Recorder(), []

    def install(module):
        module.engine = module.evaluator_engine = BatchRecordingEngine(module.tokenizer, respond)
        plain = module.rollout

        def rollout(queries, query_ids=None, rubric_of=None):
            drawn.append(list(queries))
            return plain(queries, query_ids, rubric_of)

        module.rollout = rollout

    run(cfg, extra_callbacks=[rec.callback], module_hook=install)
    return rec, drawn


def test_draws_stop_at_the_bound_and_every_step_trains_b_groups(tmp_path, tiny_ckpt, corpus_file):
    rec, drawn = _run(tmp_path, ["trainer.max_steps=2", "solver.dynamic_sampling.max_draws=3"], _responder(True))
    assert len(rec.steps) == 2  # trainer.max_steps counts SCORE steps, not draws
    assert [len(q) for q in drawn] == [2] * 6  # 3 draws of B = 2 queries per step, no more
    for step in rec.steps:
        m = step["metrics"]
        assert m["solver/sampling_draws"] == 3 and m["solver/zero_variance_group_rate"] == 1.0
        assert len(step["rollouts"].queries) == 2 and len(step["rollouts"].solver) == 4
        assert step["solver"].advantages.abs().sum() == 0  # nothing informative to keep: filled
    assert rec.steps[1]["rollouts"].queries == drawn[3][:2]  # the fill: the first groups in draw order


def test_informative_groups_are_kept_in_draw_order(tmp_path, tiny_ckpt, corpus_file):
    rec, drawn = _run(tmp_path, ["trainer.max_steps=1", "solver.dynamic_sampling.max_draws=6"], _responder(False))
    step = rec.steps[0]
    flags = [[informative(q) for q in draw] for draw in drawn]
    seen = [q for draw in drawn for q in draw]
    good = [q for q in seen if informative(q)]
    assert len(good) >= 2 or len(drawn) == 6
    assert len(drawn) > 1  # this seed's first draw holds fewer than two informative groups: the rule ran
    # the draws stopped as soon as two informative groups were held
    for n in range(1, len(drawn)):
        assert sum(sum(f) for f in flags[:n]) < 2
    assert step["rollouts"].queries == (good + [q for q in seen if not informative(q)])[:2]
    validity = step["rewards"].validity.view(2, 2)
    assert validity[:, 1].sum() == 0 and validity[:, 0].sum() == sum(informative(q) for q in step["rollouts"].queries)
    m = step["metrics"]
    assert m["solver/sampling_draws"] == len(drawn)
    assert m["solver/zero_variance_group_rate"] == pytest.approx(1 - len(good) / len(seen))
    if len(good) >= 2:
        assert (step["solver"].advantages.view(2, 2).abs().amax(dim=1) > 0).all()


def test_off_draws_once_and_logs_the_rate(tmp_path, tiny_ckpt, corpus_file):
    rec, drawn = _run(tmp_path, ["trainer.max_steps=1", "solver.dynamic_sampling.enabled=false"], _responder(False))
    assert len(drawn) == 1 and rec.steps[0]["metrics"]["solver/sampling_draws"] == 1
    expect = 1 - sum(informative(q) for q in drawn[0]) / 2
    assert rec.steps[0]["metrics"]["solver/zero_variance_group_rate"] == pytest.approx(expect)


def test_resume_with_dynamic_sampling_is_exact(tmp_path, tiny_ckpt, corpus_file):
    """2 steps straight == 1 step, stop, resume to 2: the extra draws are a pure function of (seed, step, draw)."""
    from safetensors.torch import load_file

    over = ["solver.dynamic_sampling.max_draws=3", "optim.lr=1e-3"]
    full, part = tmp_path / "full", tmp_path / "part"
    _, drawn_full = _run(full, over + ["trainer.max_steps=2"], _responder(False))
    _run(part, over + ["trainer.max_steps=1"], _responder(False))
    _, drawn_resumed = _run(part, over + ["trainer.max_steps=2"], _responder(False),
                            ckpt=part / "checkpoints" / "last.ckpt")
    steps_full = len(drawn_full)
    assert drawn_resumed == drawn_full[steps_full - len(drawn_resumed):]  # the same queries, draw for draw
    a = load_file(next((full / "export").glob("*.safetensors")))
    b = load_file(next((part / "export").glob("*.safetensors")))
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=0)


def test_dynamic_sampling_refuses_per_query_rubric_sources():
    from score_lightning.launch.config_validation import ConfigError, validate_config

    with pytest.raises(ConfigError, match="solver.dynamic_sampling.enabled=true with rubric=EvolvingRubrics"):
        validate_config(compose(["experiment=rler_tiny", "solver.dynamic_sampling.enabled=true"]))
    with pytest.raises(ConfigError, match=r"solver.dynamic_sampling.max_draws=0"):
        validate_config(compose(["experiment=tiny_score", "solver.dynamic_sampling.max_draws=0"]))
