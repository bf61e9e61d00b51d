"""One generation component and one engine builder (generation/generator.py, generation/engines.py): the trainer and
the asynchronous worker build their generator with ``build_generator``; what the module holds (engines, retriever,
harness state, step) is what its generator generates with; every process picks its roles' engines with
``build_engines``."""

from __future__ import annotations

import dataclasses
import os
import queue
from types import SimpleNamespace

import pytest

from helpers import FAST, compose
from score_lightning.generation.engines import build_engines, collective_forwards
from score_lightning.rollout.hf_engine import HFEngine
from score_lightning.rollout.scripted import ProtocolResponder, ScriptedEngine

QUERY = "How does the json module encode Python objects?"
NOTE = "Prefer the zebra standard for every dimension."


def _cfg(*overrides: str):
    return compose(FAST + list(overrides))


def _build(cfg, *args, **kwargs):
    """The engines of ``cfg``'s rollout and actor nodes."""
    return build_engines(cfg.rollout, cfg.actor, *args, **kwargs)


def test_hf_engines_run_on_each_roles_model_with_the_rollout_keys(tokenizer):
    solver, evaluator = object(), object()
    cfg = _cfg("rollout.max_batch_size=7", "rollout.grammar_fast_forward=false")
    engines = _build(cfg, tokenizer, lambda: solver, lambda: evaluator)
    assert all(isinstance(e, HFEngine) for e in engines[:2]) and engines.vllm is None
    assert engines.solver._model_getter() is solver and engines.evaluator._model_getter() is evaluator
    assert [(e.max_batch_size, e.fast_forward, e.collective) for e in engines[:2]] == [(7, False, False)] * 2
    sharded = _build(_cfg(), tokenizer, lambda: solver, lambda: evaluator, collective=True)
    # a collective module: every rank makes the same forwards, so no stored prefix and no grammar fast-forward
    assert [(e.collective, e.fast_forward, e.prefix_store.max_rows) for e in sharded[:2]] == [(True, False, 0)] * 2


def test_scripted_roles_share_one_engine(tokenizer):
    engines = _build(_cfg("rollout=scripted"), tokenizer, None, None)
    assert isinstance(engines.solver, ScriptedEngine) and engines.evaluator is engines.solver
    assert isinstance(engines.solver.respond, ProtocolResponder)


@pytest.mark.parametrize("overrides, evaluator_on_vllm", [
    ((), True),  # a shared actor scores on the vLLM engine
    (("rollout.evaluator_engine=hf",), False),  # HF generate() over the same module (its logits are needed)
    (("actor.shared=false",), False),  # a separate evaluator keeps HF generate() on its own module
])
def test_vllm_evaluator_engine_follows_the_config(tokenizer, overrides, evaluator_on_vllm):
    started, evaluator = [], object()
    vllm = lambda: started.append("vllm") or "the vLLM engine"  # noqa: E731 - the caller's way to start it
    engines = _build(_cfg("rollout=vllm", *overrides), tokenizer, object, lambda: evaluator, vllm=vllm)
    assert started == ["vllm"] and engines.solver == engines.vllm == "the vLLM engine"
    if evaluator_on_vllm:
        assert engines.evaluator == "the vLLM engine"
    else:
        assert isinstance(engines.evaluator, HFEngine) and engines.evaluator._model_getter() is evaluator


def test_engine_builder_refusals_and_collective_forwards(tokenizer):
    with pytest.raises(ValueError, match="pass vllm="):
        _build(_cfg("rollout=vllm"), tokenizer, object, object)
    with pytest.raises(ValueError, match="rollout.engine='sglang' has no engine builder: one of hf, vllm, scripted"):
        _build(_cfg(), tokenizer, object, object, kind="sglang")
    fsdp = _cfg("strategy=fsdp").strategy
    assert collective_forwards(fsdp, 2) and not collective_forwards(fsdp, 1)
    assert not collective_forwards(_cfg().strategy, 2)


def test_the_module_generates_with_what_it_holds_now(tiny_ckpt, bm25):
    """The vLLM callback swaps ``module.engine``, a test sets ``module.retriever``, the meta-harness sets
    ``module.harness_state``: the generator reads each from the module, at the call (no copy that drifts)."""
    from score_lightning.module import ScoreModule

    module = ScoreModule(_cfg("rollout=scripted"), str(tiny_ckpt))
    engine = ScriptedEngine(module.tokenizer, ProtocolResponder())
    module.engine = module.evaluator_engine = engine
    module.retriever = bm25
    assert (module.generator.engine, module.generator.evaluator_engine, module.generator.retriever) == (
        engine, engine, bm25)
    module.harness_state = dataclasses.replace(module.harness_state, notes=NOTE, version=1)
    module.score_step = 3
    ctx = module.rubric_context()
    assert (ctx.engine, ctx.state.notes, ctx.step, ctx.scheduler) == (engine, NOTE, 3, module.scheduler)
    rollouts = module.rollout([QUERY], ["q0"])
    rewards = module.score(rollouts)
    rubric = [r for r in engine.requests if r.role == "rubric"]
    assert len(rubric) == 1 and NOTE in rubric[0].prompt
    assert len(rollouts.solver) == module.K == 2 and rewards.rewards.shape == (2,)
    assert {r.role for r in engine.requests} >= {"rubric", "solver", "scoring"}


def test_the_worker_builds_its_generator_as_the_module_does(tiny_ckpt, corpus_file):
    """Same settings, rubric source and sampling from one builder; the worker generates under each request's
    harness state and step, and closes what it opened when it stops."""
    from omegaconf import OmegaConf

    from score_lightning.generation.async_worker import GenerationRequest, WorkerHost, WorkerSpec, serve
    from score_lightning.module import ScoreModule

    cfg = _cfg("rollout=scripted", "rollout.mode=async", "solver.dynamic_sampling.enabled=true")
    module = ScoreModule(cfg, str(tiny_ckpt))
    host = WorkerHost(WorkerSpec(OmegaConf.to_container(cfg, resolve=True), str(tiny_ckpt), str(tiny_ckpt), 1,
                                 os.getpid()))
    mine, theirs = module.generator, host.generator
    assert (theirs.rollout_settings, theirs.K) == (mine.rollout_settings, mine.K)
    # the rewards and dynamic sampling read the run's nodes: the worker's config holds the same values
    for group in ("reward", "verifier", "evaluator", "judge"):
        assert theirs.cfg[group] == mine.cfg[group], group
    assert theirs.cfg.solver.dynamic_sampling.enabled and type(theirs.rubric_source) is type(mine.rubric_source)
    assert theirs.tokenizer.get_vocab() == mine.tokenizer.get_vocab()
    assert isinstance(theirs.engine, ScriptedEngine) and theirs.evaluator_engine is theirs.engine
    assert theirs.retriever is not None  # opened from the config in the worker's own process
    state = dataclasses.replace(module.harness_state, notes=NOTE, version=4)
    batch = host.generate(GenerationRequest(5, 5, ["q0"], [QUERY], state, module.scheduler,
                                            module.rubric_source.state_dict()))
    assert theirs.score_step == 5 and batch.info["harness_version"] == 4
    assert any(NOTE in r.prompt for r in theirs.engine.requests if r.role == "rubric")
    # its loop ends on the trainer's None (a broken request is answered with an error, not fatal) and closes what
    # generating opened in its process: the retriever (an MCP stdio server), the services' clients (the judge's)
    closed: list[str] = []
    theirs.retriever = SimpleNamespace(close=lambda: closed.append("retriever"))
    theirs.services["judge"] = SimpleNamespace(close=lambda: closed.append("judge"))
    requests, results = queue.Queue(), queue.Queue()
    for msg in (("slots", {}), ("batch", b"not a request"), None):
        requests.put(msg)
    serve(host, requests, results, os.getppid())
    assert results.get_nowait()[0] == "error" and results.empty()
    assert closed == ["retriever", "judge"] and theirs.services == {}
