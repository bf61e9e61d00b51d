"""``optim.rollout_correction`` on the real model: what the HF engine records, and what the updates do with it.

* The HF engine samples from the trainer's own module, so its recorded log-probs are the trainer's to
  rounding: rolled out through the agent loop (multi-turn, observations, temperature 0.8 and top-p 0.7),
  then recomputed by the trainer, every ratio is 1 within 1e-4 per token. That is why ``auto`` means
  ``none`` for ``rollout=hf``, and it checks the recording (a wrong temperature is off by > 1e-2).
* The solver's GRPO update and the evaluator's REINFORCE update with engine log-probs ln 4 below the
  trainer's on every model token (rho = 4): truncation at C_max = 3 makes the gradient exactly 3x the
  uncorrected one, masking makes it 0, and junk engine log-probs on observation tokens change nothing.
"""

from __future__ import annotations

import math

import pytest
import torch

from helpers import FAST, compose
from score_lightning.rollout.trajectory import Trajectory
from score_lightning.step.batching import build_token_batch, policy_logprobs
from score_lightning.step.rollout_correction import MODES, behaviour_logprobs, importance_weights, mismatch_sums

#: per-token tolerance on |log pi_old - log mu| for the HF engine. Both sides are float32 forwards of the
#: same weights; they differ only in summation order (incremental KV-cache decoding of a left-padded batch
#: against one right-padded forward), ~1e-6 on these log-probs. 1e-4 leaves 100x room, and is still 100x
#: below a real recording error: the wrong temperature (1.0 for 0.8) is off by > 1e-2, top-p's
#: renormalisation (what vLLM returns) by log S, tenths of a nat at top-p 0.7.
TOKEN_TOL = 1e-4
#: a sequence ratio sums its row's per-token errors (up to ~160 model tokens here): measured 5e-5 at most
#: (per token 5e-6; 2026-12, one CPU thread); 1e-3 is 20x that and still 100x below log S
SEQUENCE_TOL = 1e-3


def test_hf_engine_log_probs_give_weights_of_one(bm25):
    from score_lightning.data.queries import load_queries
    from score_lightning.harness.state import HarnessState
    from score_lightning.policy.models import load_policy, load_tokenizer
    from score_lightning.roles.prompts import solver_messages
    from score_lightning.roles.rubric import fallback_rubric
    from score_lightning.rollout.agent import AgentConfig, run_agent
    from score_lightning.rollout.chat import encode_chat
    from score_lightning.rollout.hf_engine import HFEngine
    from score_lightning.sft.asset import ASSET_DIR

    model, tok = load_policy(ASSET_DIR, "float32").eval(), load_tokenizer(ASSET_DIR)  # the cold start: it searches
    state = HarnessState()
    prompts = [encode_chat(tok, solver_messages(q.prompt, fallback_rubric(state), state, 2))
               for q in load_queries(None)[:3] for _ in range(2)]
    temp = 0.8
    cfg = AgentConfig(max_tool_calls=2, max_response_tokens=160, max_observation_tokens=16, topk=1, temperature=temp,
                      top_p=0.7)
    torch.manual_seed(3)
    trajs = run_agent(HFEngine(lambda: model, tok.pad_token_id, tok.eos_token_id, tok, 64), tok, prompts, bm25, cfg)
    batch = build_token_batch([t.prompt_ids for t in trajs], [t.response_ids for t in trajs],
                              [t.response_mask for t in trajs], tok.pad_token_id)
    with torch.no_grad():
        old, _ = policy_logprobs(model, batch, temp)
        untempered, _ = policy_logprobs(model, batch, 1.0)
    mu = behaviour_logprobs(trajs, tuple(batch.loss_mask.shape))
    mask = batch.loss_mask
    assert any(0 in t.response_mask for t in trajs)  # observations (mask 0) inside the responses
    assert torch.isfinite(mu[mask.bool()]).all()  # every model token has its engine log-prob
    w = importance_weights(old, mu, mask, "token_truncate")
    assert torch.equal(w.valid, mask.bool())  # ... and only model tokens enter
    lr = w.log_ratio[w.valid]
    n = int(mask.sum())
    print(f"\n{n} model tokens: max |log rho_t| = {lr.abs().max():.2e}, "
          f"max |sum log rho| per row = {w.log_ratio.sum(dim=1).abs().max():.2e}")
    assert lr.abs().max() < TOKEN_TOL
    for mode in MODES[1:]:
        m = importance_weights(old, mu, mask, mode)
        tol = SEQUENCE_TOL if mode.startswith("sequence") else TOKEN_TOL
        assert (m.weight[m.valid] - 1).abs().max() < tol and not m.outside.any(), mode
    sums = mismatch_sums(old, mu, mask)
    assert sums["tokens"] == n and 0 <= sums["k3"] / n < TOKEN_TOL ** 2 and abs(sums["k1"] / n) < TOKEN_TOL
    # the check can fail: trainer log-probs at the wrong temperature are visibly off
    assert importance_weights(untempered, mu, mask, "token_mask").log_ratio[w.valid].abs().max() > 1e-2


def _rows(tok, n_rows: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    vocab = tok.vocab_size if hasattr(tok, "vocab_size") else 200
    out = []
    for _ in range(n_rows):
        prompt = torch.randint(10, vocab - 1, (6,), generator=g).tolist()
        resp = torch.randint(10, vocab - 1, (9,), generator=g).tolist()
        out.append((prompt, resp, [1, 1, 1, 0, 0, 0, 1, 1, 1]))  # an observation in the middle
    return out


def _engine_logprobs(model, rows, temperature: float, shift: list[float]) -> list[list[float]]:
    """The trainer's own log-prob of each response token, minus ``shift[row]`` on model tokens; junk on mask 0."""
    batch = build_token_batch([p for p, _, _ in rows], [r for _, r, _ in rows], [m for _, _, m in rows], 0)
    with torch.no_grad():
        lp, _ = policy_logprobs(model, batch, temperature)
    out = []
    for i, (p, r, m) in enumerate(rows):
        own = lp[i, len(p) - 1:len(p) - 1 + len(r)].tolist()
        out.append([x - shift[i] if keep else 50.0 for x, keep in zip(own, m)])
    return out


def _grads(model) -> torch.Tensor:
    return torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros(p.numel()) for p in model.parameters()])


def _solver_grad(tiny_ckpt, tok, mode: str, shift: list[float]) -> torch.Tensor:
    from score_lightning.policy.models import load_policy
    from score_lightning.step.rollout_correction import rollout_correction
    from score_lightning.step.solver_update import OptimizerHooks, grpo_settings, solver_update

    cfg = compose(FAST + [f"optim.rollout_correction={mode}", "loss.kl_coef=0", "solver.temperature=0.8"])
    settings = grpo_settings(cfg.solver, cfg.optim, cfg.loss, cfg.reward,
                             rollout_correction(cfg.optim, cfg.loss, cfg.rollout))
    model = load_policy(tiny_ckpt, "float32")
    rows = _rows(tok, 2, seed=0)
    lps = _engine_logprobs(model, rows, 0.8, shift)
    trajs = [Trajectory(p, r, m, lp) for (p, r, m), lp in zip(rows, lps)]
    seen = []
    hooks = OptimizerHooks(lambda loss: loss.backward(), lambda: (seen.append(_grads(model)), (0.0, True))[1],
                           torch.device("cpu"))
    res = solver_update(model, None, trajs, torch.tensor([1.0, 0.0]), settings, 0, hooks)
    assert len(seen) == 1
    if mode != "none":
        assert res.correction["tokens"] == 12  # 6 model tokens per row; the 3 observation tokens never count
    return seen[0]


@pytest.mark.parametrize("mode,factor", [("token_truncate", 3.0), ("sequence_truncate", 3.0), ("token_mask", 0.0),
                                         ("sequence_mask", 0.0)])
def test_solver_update_scales_the_policy_gradient_by_the_weight(tiny_ckpt, tokenizer, mode, factor):
    """rho = 4 on every model token (a sequence ratio 4^6): every weight is C_max = 3 (truncate) or 0 (mask)."""
    plain = _solver_grad(tiny_ckpt, tokenizer, "none", [0.0, 0.0])
    assert plain.abs().max() > 0
    got = _solver_grad(tiny_ckpt, tokenizer, mode, [math.log(4.0)] * 2)
    torch.testing.assert_close(got, factor * plain, rtol=1e-4, atol=1e-5 * float(plain.abs().max()))


def test_solver_update_ignores_engine_log_probs_that_agree(tiny_ckpt, tokenizer):
    """Engine log-probs equal to the trainer's (rho = 1, junk on the observation): the uncorrected gradient."""
    plain = _solver_grad(tiny_ckpt, tokenizer, "none", [0.0, 0.0])
    for mode in MODES[1:]:
        got = _solver_grad(tiny_ckpt, tokenizer, mode, [0.0, 0.0])
        torch.testing.assert_close(got, plain, rtol=1e-4, atol=1e-5 * float(plain.abs().max()))


@pytest.mark.parametrize("mode,factor", [("none", 1.0), ("token_truncate", 3.0), ("sequence_mask", 0.0)])
def test_evaluator_update_weights_the_rubric_tokens(tiny_ckpt, tokenizer, mode, factor):
    from score_lightning.policy.models import load_policy
    from score_lightning.roles.rubric import Rubric
    from score_lightning.step.evaluator_update import evaluator_update, reinforce_settings
    from score_lightning.step.rollout_correction import rollout_correction
    from score_lightning.step.solver_update import OptimizerHooks
    from score_lightning.step.types import RubricSample

    def grad(m: str, shift: float) -> tuple[torch.Tensor, dict]:
        cfg = compose(FAST + [f"optim.rollout_correction={m}", "loss.kl_coef=0"])
        settings = reinforce_settings(cfg.evaluator, cfg.loss, cfg.actor,
                                      rollout_correction(cfg.optim, cfg.loss, cfg.rollout))
        model = load_policy(tiny_ckpt, "float32")
        (p, r, mask), = _rows(tokenizer, 1, seed=1)
        (lps,) = _engine_logprobs(model, [(p, r, mask)], settings.temperature, [shift])
        sample = RubricSample(Rubric(("a",), (1.0,)), True, "", p, r, mask, False, lps)
        seen = []
        hooks = OptimizerHooks(lambda loss: loss.backward(), lambda: (seen.append(_grads(model)), (0.0, True))[1],
                               torch.device("cpu"))
        out = evaluator_update(model, None, [sample], [0.7], settings, 0, hooks)
        return seen[0], out

    plain, _ = grad("none", 0.0)
    got, out = grad(mode, math.log(4.0))
    torch.testing.assert_close(got, factor * plain, rtol=1e-4, atol=1e-5 * float(plain.abs().max()))
    if mode == "token_truncate":
        assert out["evaluator/is_weight_mean"] == pytest.approx(3.0) and out["evaluator/is_clipped_frac"] == 1.0
    if mode == "sequence_mask":
        assert out["evaluator/is_weight_mean"] == 0.0 and out["evaluator/is_masked_frac"] == 1.0
