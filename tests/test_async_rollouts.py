"""rollout.mode=async: the worker process, policy versions and staleness, weights at the step boundary, resume.

Real runs on the tiny model: the scripted engine (deterministic, so bit-for-bit comparisons hold) and the HF
engine in the worker (its own model copy, seeded per request from (seed, step)).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import FAST, compose, process_alive, read_scalars
from test_grounded_rewards import Recorder

SCRIPTED = ["rollout=scripted", "solver.max_response_tokens=200", "evaluator.max_response_tokens=400",
            "evaluator.max_rubric_tokens=160", "optim.lr=1e-3", "harness.every_n_steps=1"]
#: dynamic sampling with a script whose groups are informative or not by a rule of the query (test_dynamic_sampling)
DRAWS = ["rollout=scripted", "rollout.responder._target_=test_dynamic_sampling._responder",
         "~rollout.responder.verify_searches", "+rollout.responder.all_uninformative=false",
         "verifier.min_search_depth=1", "solver.max_response_tokens=160", "evaluator.max_response_tokens=400",
         "evaluator.max_rubric_tokens=96", "reward.require_citation=true", "data.batch_size=2",
         "optim.mini_batch_size=2", "optim.micro_batch_size=4", "solver.dynamic_sampling.enabled=true",
         "solver.dynamic_sampling.max_draws=3", "optim.lr=1e-3"]
#: non-zero gradients on a random model (no reward): the weights move, so a stale copy shows
MOVING = ["optim.lr=1e-3", "loss.entropy_coef=0.01"]


def _run(out: Path, extra: list[str], callbacks=(), hook=None):
    from score_lightning.launch.training import run

    return run(compose(FAST + [f"paths.output_dir={out}"] + extra), extra_callbacks=list(callbacks), module_hook=hook)


def _export(out: Path) -> dict[str, torch.Tensor]:
    return load_file(next((out / "export").glob("*.safetensors")))


def _values(scalars: dict, tag: str) -> list[float]:
    return [v for _, v in scalars[tag]]


# "dynamic_sampling" (39 s) runs in make test-multiprocess (CI); "scripted" keeps the property in the default suite
@pytest.mark.parametrize("recipe", ["scripted", pytest.param("dynamic_sampling", marks=pytest.mark.multiprocess)])
def test_max_staleness_0_reproduces_sync_bit_for_bit(tmp_path, tiny_ckpt, corpus_file, recipe):
    """The worker generates each step's batch under that step's weights, harness state and scheduler hints:
    3 steps equal rollout.mode=sync exactly (exported weights, logged rewards, baseline, harness versions).

    Both trainers get one torch thread (async splits threads.num=2 into trainer 1 + worker 1): at threads=auto
    on 2 cores, sync would update with 2 threads and async with 1, and the float reductions differ in the last bit."""
    base = (SCRIPTED if recipe == "scripted" else DRAWS) + ["trainer.max_steps=3"]
    _run(tmp_path / "sync", base + ["threads.num=1"])
    _run(tmp_path / "async", base + ["rollout.mode=async", "rollout.max_staleness=0", "threads.num=2"])
    a, b = _export(tmp_path / "sync"), _export(tmp_path / "async")
    start = load_file(next(Path(tiny_ckpt).glob("*.safetensors")))
    assert max(float((a[k] - start[k]).abs().max()) for k in a) > 1e-4, "nothing trained: the comparison is vacuous"
    assert all(torch.equal(a[k], b[k]) for k in a)
    sa, sb = read_scalars(tmp_path / "sync" / "tensorboard"), read_scalars(tmp_path / "async" / "tensorboard")
    for tag in ("solver/reward_mean", "solver/reward_std", "evaluator/baseline", "harness/version",
                "solver/sampling_draws", "rollout/generated_tokens"):
        assert _values(sa, tag) == _values(sb, tag), tag
    assert _values(sb, "rollout/staleness_max") == [0.0, 0.0, 0.0]
    assert "rollout/staleness_max" not in sa and "time/wait_s" not in sa  # sync logs what it did before
    if recipe == "dynamic_sampling":
        assert max(_values(sb, "solver/sampling_draws")) > 1  # the worker made extra draws


@pytest.mark.multiprocess  # 28 s: make test-multiprocess (CI)
def test_staleness_1_trains_nothing_older_than_one_version(tmp_path, tiny_ckpt, corpus_file):
    from score_lightning.generation.generator import POLICY_VERSION

    rec, used = Recorder(), []

    def hook(module):  # the harness version each trained batch's prompts were written under
        take = module.prefetch.take

        def recording(*args):
            got = take(*args)
            used.append(got.info["harness_version"])
            return got

        module.prefetch.take = recording

    _run(tmp_path, SCRIPTED + ["trainer.max_steps=4", "rollout.mode=async", "rollout.max_staleness=1"], [rec.callback],
         hook=hook)
    assert len(rec.steps) == 4
    # harness.every_n_steps=1 refreshes after every step: at step t the trainer holds version t, which sync's
    # prompts would use; the worker's batch t was asked for during step t-1, before that step's refresh
    assert [s["metrics"]["harness/version"] for s in rec.steps] == [0.0, 1.0, 2.0, 3.0]
    assert used == [0, 0, 1, 2]
    for step, s in enumerate(rec.steps):
        ro = s["rollouts"]
        versions = [t.meta[POLICY_VERSION] for t in ro.solver] + [r.policy_version for r, _ in ro.rubrics.samples]
        assert ro.rubrics.samples and len(versions) == len(ro.solver) + len(ro.rubrics.samples)
        assert all(step - v <= 1 for v in versions), (step, versions)
        # step 0 had nothing ahead of it; every later batch was asked for one version earlier, during the update
        assert set(versions) == {max(step - 1, 0)}
        assert all(t.meta[POLICY_VERSION] == versions[0] for t in ro.scoring)
    scalars = read_scalars(tmp_path / "tensorboard")
    assert _values(scalars, "rollout/staleness_max") == [0.0, 1.0, 1.0, 1.0]
    assert _values(scalars, "rollout/staleness_mean") == [0.0, 1.0, 1.0, 1.0]
    assert all(v >= 0 for v in _values(scalars, "time/wait_s"))


@pytest.mark.multiprocess  # 23 s: make test-multiprocess (CI)
def test_a_batch_older_than_max_staleness_is_regenerated(tmp_path, tiny_ckpt, corpus_file):
    """A checkpoint of a max_staleness=1 run holds step 2's batch of version 1; resumed with max_staleness=0,
    that batch is discarded and step 2 trains a fresh one of version 2."""
    from score_lightning.generation.generator import trajectory_versions

    common = SCRIPTED + ["rollout.mode=async", "callbacks.model_checkpoint.every_n_steps=1"]
    _run(tmp_path, common + ["trainer.max_steps=2", "rollout.max_staleness=1"])
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)  # the stored batch loads safely
    stored = ckpt["score"]["async_rollouts"]["batch"]
    from score_lightning.generation.batch_codec import decode

    assert (decode(stored).step, decode(stored).version) == (2, 1)
    rec = Recorder()
    _run(tmp_path, common + ["trainer.max_steps=3", "rollout.max_staleness=0",
                             f"ckpt_path={tmp_path}/checkpoints/last.ckpt"], [rec.callback])
    assert set(trajectory_versions(rec.steps[0]["rollouts"])) == {2}
    assert rec.steps[0]["metrics"]["rollout/discarded_batches"] == 1.0
    assert rec.steps[0]["metrics"]["rollout/staleness_max"] == 0.0


# "all" (27 s) and "lora" (26 s) run in make test-multiprocess (CI)
@pytest.mark.parametrize("trains", [pytest.param("all", marks=pytest.mark.multiprocess),
                                    pytest.param("lora", marks=pytest.mark.multiprocess), "top_layers"])
def test_the_worker_samples_with_the_trainers_weights(tmp_path, tiny_ckpt, corpus_file, trains):
    """HF engine in the worker, weights pushed at each step boundary (only the trainable tensors). With
    max_staleness=0 the engine's log-probs equal the trainer's pi_old at every step although the weights
    move; with max_staleness=1 they differ by one update (what the IS correction then sees)."""
    extra = {"all": [], "lora": ["model.lora.enabled=true", "model.lora.r=4", "model.lora.alpha=8"],
             "top_layers": ["model.trainable_layers=1"]}[trains]
    seen = {}

    def hook(module):
        seen["module"] = module

    common = MOVING + extra + ["trainer.max_steps=3", "rollout.mode=async", "optim.rollout_correction=token_truncate"]
    _run(tmp_path / "s0", common + ["rollout.max_staleness=0"], hook=hook)
    module = seen["module"]
    trainable = {n for n, p in module.policy.named_parameters() if p.requires_grad}
    slots = module.prefetch._slots["solver"]
    assert set(slots) == trainable  # only what the optimiser can change crosses to the worker
    if trains != "all":
        assert len(trainable) < len(list(module.policy.parameters()))
    if trains == "lora":
        assert all("lora_" in n for n in slots)
    assert module.prefetch.proc is None  # closed with the run
    s0 = read_scalars(tmp_path / "s0" / "tensorboard")
    assert max(abs(v) for v in _values(s0, "rollout/mismatch_k1")) < 1e-4
    if trains != "all":
        return
    _run(tmp_path / "s1", common + ["rollout.max_staleness=1"])
    s1 = read_scalars(tmp_path / "s1" / "tensorboard")
    assert abs(_values(s1, "rollout/mismatch_k1")[0]) < 1e-4  # step 0: nothing had moved yet
    assert max(_values(s1, "rollout/mismatch_kl")[1:]) > 1e-6 > max(_values(s0, "rollout/mismatch_kl"))


@pytest.mark.slow  # 35 s; async resume without dynamic sampling runs in make test-multiprocess (test_module)
def test_async_resume_with_dynamic_sampling_is_exact(tmp_path, tiny_ckpt, corpus_file):
    """3 steps straight == 2, stop, resume to 3 under max_staleness=1: the checkpoint carries the batch in flight."""
    common = DRAWS + ["rollout.mode=async", "callbacks.model_checkpoint.every_n_steps=1"]
    _run(tmp_path / "full", common + ["trainer.max_steps=3"])
    _run(tmp_path / "part", common + ["trainer.max_steps=2"])
    _run(tmp_path / "part", common + ["trainer.max_steps=3", f"ckpt_path={tmp_path}/part/checkpoints/last.ckpt"])
    a, b = _export(tmp_path / "full"), _export(tmp_path / "part")
    assert all(torch.equal(a[k], b[k]) for k in a)
    sa, sb = read_scalars(tmp_path / "full" / "tensorboard"), read_scalars(tmp_path / "part" / "tensorboard")
    assert _values(sa, "solver/reward_mean") == _values(sb, "solver/reward_mean")
    assert _values(sb, "rollout/staleness_max") == [0.0, 1.0, 1.0]


def test_the_worker_stops_when_the_run_raises(tmp_path, tiny_ckpt, corpus_file):
    from score_lightning.errors import TrainingHalted

    seen = {}
    with pytest.raises(TrainingHalted):
        _run(tmp_path, SCRIPTED + ["rollout.mode=async", "trainer.max_steps=6", "debug.nan_grad_steps=[0,1,2,3]",
                                   "optim.max_consecutive_skips=1", "evaluator.enabled=false"],
             hook=lambda m: seen.setdefault("m", m))
    prefetch = seen["m"].prefetch
    assert prefetch.pid is not None and prefetch.proc is None
    assert not process_alive(prefetch.pid)




def test_the_batch_codec_round_trips_a_step_and_refuses_foreign_types(tmp_path, tiny_ckpt, corpus_file):
    import dataclasses
    import io

    from score_lightning.generation.async_worker import GeneratedBatch
    from score_lightning.generation.batch_codec import decode, encode

    rec = Recorder()
    _run(tmp_path, SCRIPTED + ["trainer.max_steps=1"], [rec.callback])
    s = rec.steps[0]
    got = GeneratedBatch(0, 0, ["a"], ["q"], s["rollouts"], s["rewards"], (0.0, 1.0, 1.0), info={"nan": math.nan})
    buf = io.BytesIO()
    torch.save({"b": encode(got)}, buf)
    buf.seek(0)
    back = decode(torch.load(buf, weights_only=True)["b"])
    assert back.rollouts.solver[0].response_ids == got.rollouts.solver[0].response_ids
    assert back.rollouts.rubrics.first == got.rollouts.rubrics.first  # a frozen dataclass, rebuilt
    assert torch.equal(back.rewards.rewards, got.rewards.rewards)
    assert back.drawn == got.drawn and math.isnan(back.info["nan"])
    assert dataclasses.asdict(back.rollouts.solver[1]) == dataclasses.asdict(got.rollouts.solver[1])

    @dataclasses.dataclass
    class Foreign:
        x: int = 1

    with pytest.raises(TypeError, match=r"batch\.info\[.f.\]: dataclass .*Foreign is outside score_lightning"):
        encode(dataclasses.replace(got, info={"f": Foreign()}))
    with pytest.raises(TypeError, match="cannot store a builtins.object"):
        encode([object()])
    with pytest.raises(ValueError, match="only score_lightning dataclasses"):
        decode({"__dataclass__": "os:PathLike", "fields": {}})


def test_async_combinations_are_refused_by_name():
    from score_lightning.launch.config_validation import ConfigError, validate_config

    validate_config(compose(["experiment=tiny_score", "rollout.mode=async"]))  # the supported recipe
    validate_config(compose(["experiment=tiny_score", "rollout.mode=async", "solver.dynamic_sampling.enabled=true"]))
    validate_config(compose(["experiment=tiny_score", "rollout=vllm", "rollout.mode=async"]))  # the worker's own vLLM
    for extra, says in ((["rollout=vllm", "rollout.enable_sleep_mode=true"],
                         "rollout.mode=async with rollout.enable_sleep_mode=true: the worker's vLLM engine generates"),
                        (["strategy=ddp", "trainer.devices=2", "data.batch_size=2", "optim.mini_batch_size=2"],
                         "rollout.mode=async with 2 data-parallel processes"),
                        (["strategy=fsdp", "trainer.devices=1"], "rollout.mode=async with strategy=fsdp"),
                        (["rubric=evolving"], "rollout.mode=async with rubric=evolving"),
                        (["rollout.max_staleness=-1"], "rollout.max_staleness=-1: allowed an integer >= 0")):
        with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace(")", r"\)")):
            validate_config(compose(["experiment=tiny_score", "rollout.mode=async", *extra]))
    with pytest.raises(ConfigError, match="rollout.mode='later': allowed one of: sync, async"):
        validate_config(compose(["experiment=tiny_score", "rollout.mode=later"]))


def test_auto_rollout_correction_turns_on_for_stale_hf_batches_only():
    from score_lightning.step.rollout_correction import resolve_mode, rollout_correction

    def mode(*extra):
        cfg = compose(["experiment=tiny_score", *extra])
        return rollout_correction(cfg.optim, cfg.loss, cfg.rollout).mode

    assert mode() == "none"
    assert mode("rollout.mode=async") == "token_truncate"  # engine log-probs of an older policy version
    assert mode("rollout.mode=async", "rollout.max_staleness=0") == "none"  # the same weights sample and train
    assert mode("rollout.mode=async", "rollout=scripted") == "none"  # the script's log-probs are a constant
    assert mode("rollout.mode=async", "optim.rollout_correction=none") == "none"  # an explicit mode stays
    assert resolve_mode("auto", "vllm") == "token_truncate" and resolve_mode("auto", "hf") == "none"
    assert mode("rollout.mode=async", "rollout=vllm") == "token_truncate"  # vLLM's sampling log-probs, one version old
    assert mode("rollout.mode=async", "rollout=vllm", "rollout.max_staleness=0") == "token_truncate"  # its kernels
