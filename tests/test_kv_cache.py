"""The HF engine's in-place KV cache and shared-prompt prefill (rollout/kv_cache.py) change no output."""

from __future__ import annotations

import torch

from score_lightning.rollout.engine import SamplingParams
from score_lightning.rollout.hf_engine import HFEngine
from score_lightning.rollout.kv_cache import GrowingCache, GrowingLayer, prefill
from transformers.cache_utils import DynamicLayer


def test_growing_layer_holds_what_concatenation_holds():
    g, d = GrowingLayer(capacity=5), DynamicLayer()
    torch.manual_seed(0)
    for n in (3, 1, 1, 4):  # the fourth chunk exceeds the capacity: the buffer doubles (to 10)
        k, v = torch.randn(2, 3, n, 4), torch.randn(2, 3, n, 4)
        gk, gv = g.update(k, v)
        dk, dv = d.update(k, v)
        assert torch.equal(gk, dk) and torch.equal(gv, dv) and g.get_seq_length() == d.get_seq_length()
    ptr = g._k.data_ptr()
    g.update(torch.randn(2, 3, 1, 4), torch.randn(2, 3, 1, 4))
    assert g._k.data_ptr() == ptr  # appended in place, no copy
    g.select_rows(torch.tensor([1, 1, 0]))
    assert torch.equal(g.keys[0], g.keys[1]) and g.keys.shape[0] == 3


def _plain_greedy(model, prompt: list[int], n: int, pad: int, eos: list[int]) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                         eos_token_id=eos, pad_token_id=pad)
    row = out[0, len(prompt):].tolist()
    return row[: next((i + 1 for i, t in enumerate(row) if t in eos), len(row))]


def test_engine_with_shared_prefill_matches_plain_generate_per_row(tiny_ckpt, tokenizer):
    from score_lightning.policy.models import load_policy

    model = load_policy(tiny_ckpt, "float32").eval()
    a = tokenizer("<think>the json module</think> reads", add_special_tokens=False)["input_ids"]
    b = tokenizer("python data files", add_special_tokens=False)["input_ids"]
    prompts = [a, b, a, a, b]  # repeated prompts of two lengths (left padding)
    eng = HFEngine(lambda: model, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer, 64)
    calls = []
    hook = model.register_forward_pre_hook(lambda m, args, kw: calls.append(kw["input_ids"].shape), with_kwargs=True)
    gens = eng.generate(prompts, SamplingParams(12, 0.0, logprobs=True))
    hook.remove()
    assert calls[0] == (2, max(len(a), len(b)) - 1)  # the prefill: two distinct prompts, all but the last column
    assert calls[1][0] == 5 and calls[1][1] == 1  # generate restarts from the filled cache with one column
    eos = list(eng.eos_token_ids)
    for p, g in zip(prompts, gens):
        assert g.token_ids == _plain_greedy(model, p, 12, tokenizer.pad_token_id, eos)
    # the recorded log-probs are those of the row's own tokens under the model
    from score_lightning.step.batching import build_token_batch, policy_logprobs

    batch = build_token_batch([a], [gens[0].token_ids], [[1] * len(gens[0].token_ids)], tokenizer.pad_token_id)
    with torch.no_grad():
        lp, _ = policy_logprobs(model, batch)
    ref = lp[0, len(a) - 1:len(a) - 1 + len(gens[0].token_ids)]
    assert torch.allclose(torch.tensor(gens[0].logprobs), ref, atol=1e-4)


def test_prefill_runs_each_distinct_prompt_once(tiny_ckpt):
    from score_lightning.policy.models import load_policy

    model = load_policy(tiny_ckpt, "float32").eval()
    ids = torch.tensor([[0, 5, 6, 7], [9, 9, 9, 9], [0, 5, 6, 7]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1]])
    cache = GrowingCache(16)
    assert prefill(model, ids, mask, cache) == 2 * 3  # two distinct rows x three columns
    assert cache.get_seq_length() == 3 and cache.layers[0].keys.shape[0] == 3
    assert torch.equal(cache.layers[0].keys[0], cache.layers[0].keys[2])


def test_multi_turn_rollouts_reuse_the_stored_prefix_and_match_recomputation(bm25):
    """The agent loop's later turns run only their new tokens, and every trajectory is the one a full recomputation
    gives (greedy), with the same recorded log-probs. The packaged cold start searches, so there are later turns."""
    from score_lightning.data.queries import load_queries
    from score_lightning.harness.state import HarnessState
    from score_lightning.policy.models import load_policy, load_tokenizer
    from score_lightning.roles.prompts import solver_messages
    from score_lightning.roles.rubric import fallback_rubric
    from score_lightning.rollout.agent import AgentConfig, run_agent
    from score_lightning.rollout.chat import encode_chat
    from score_lightning.rollout.kv_cache import PrefixStore
    from score_lightning.sft.asset import ASSET_DIR

    model, tokenizer = load_policy(ASSET_DIR, "float32").eval(), load_tokenizer(ASSET_DIR)
    state = HarnessState()
    prompts = [encode_chat(tokenizer, solver_messages(q.prompt, fallback_rubric(state), state, 2))
               for q in load_queries(None)[:2]]
    cfg = AgentConfig(max_tool_calls=2, max_response_tokens=160, max_observation_tokens=16, topk=1, temperature=0.0)

    def rollouts(store_rows: int):
        eng = HFEngine(lambda: model, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer, 64)
        eng.prefix_store = PrefixStore(store_rows)
        seen = []
        hook = model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["input_ids"].shape[1]), with_kwargs=True)
        try:
            return run_agent(eng, tokenizer, prompts, bm25, cfg), seen
        finally:
            hook.remove()

    plain, cols_plain = rollouts(0)
    reused, cols_reused = rollouts(8)
    assert [t.response_ids for t in reused] == [t.response_ids for t in plain]
    assert all(torch.allclose(torch.tensor(a.engine_logprobs), torch.tensor(b.engine_logprobs), atol=1e-4)
               for a, b in zip(reused, plain))
    assert any(t.tool_calls for t in plain)  # there were later turns to reuse for
    assert sum(cols_reused) < sum(cols_plain)


def test_prefix_store_is_dropped_when_the_weights_change(tiny_ckpt, tokenizer):
    from score_lightning.policy.models import load_policy

    model = load_policy(tiny_ckpt, "float32")
    eng = HFEngine(lambda: model, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer, 64)
    eng.generate([[5, 6, 7, 8] * 5], SamplingParams(4, 0.0))
    eng.prefix_store.check_weights(model)
    assert eng.prefix_store.entries
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=torch.tensor([[5, 6, 7]])).logits.sum().backward()
    opt.step()
    eng.prefix_store.check_weights(model)
    assert not eng.prefix_store.entries
    eng.generate([[5, 6, 7, 8] * 5], SamplingParams(4, 0.0))
    eng.release_cache()
    assert not eng.prefix_store.entries


def test_grouped_attention_equals_hf_sdpa(tiny_ckpt):
    from transformers import AutoModelForCausalLM

    from score_lightning.policy.models import load_policy

    ours = load_policy(tiny_ckpt, "float32").eval()
    hf = AutoModelForCausalLM.from_pretrained(str(tiny_ckpt), dtype=torch.float32).eval()
    assert ours.config._attn_implementation == "score_sdpa" and hf.config._attn_implementation == "sdpa"
    torch.manual_seed(0)
    ids = torch.randint(0, 4000, (3, 40))
    mask = torch.ones_like(ids)
    mask[0, :7] = 0
    mask[1, :3] = 0
    with torch.no_grad():
        a, b = ours(input_ids=ids, attention_mask=mask).logits, hf(input_ids=ids, attention_mask=mask).logits
    assert torch.allclose(a[mask.bool()], b[mask.bool()], atol=1e-5)
    kw = dict(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(**kw), hf.generate(**kw))


def test_grouped_attention_is_cpu_only(monkeypatch):
    """Off the CPU (measured only there; on CUDA the folded layout would copy the mask per group) a query
    takes HF's own sdpa path. A meta-device query stands in for a GPU's here."""
    import score_lightning.policy.attention as A

    calls = []
    monkeypatch.setattr(A, "sdpa_attention_forward", lambda *a, **k: calls.append(a[1].device.type) or ("hf", None))
    module = type("Attn", (), {"num_key_value_groups": 3})()
    q = torch.zeros(1, 6, 4, 8, device="meta")
    kv = torch.zeros(1, 2, 4, 8, device="meta")
    mask = torch.zeros(1, 1, 4, 4, device="meta")
    assert A.grouped_sdpa_attention_forward(module, q, kv, kv, mask)[0] == "hf" and calls == ["meta"]
    cpu_q, cpu_kv, cpu_mask = torch.zeros(1, 6, 4, 8), torch.zeros(1, 2, 4, 8), torch.zeros(1, 1, 4, 4)
    out, _ = A.grouped_sdpa_attention_forward(module, cpu_q, cpu_kv, cpu_kv, cpu_mask)
    assert calls == ["meta"] and tuple(out.shape) == (1, 4, 6, 8)  # the CPU query took the grouped path
