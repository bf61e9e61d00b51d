"""Engine-trainer importance weights (``optim.rollout_correction``) against hand computations.

Every number below is worked out by hand from chosen log-ratios (ln 2, ln 4, ln 1/4): the weights of
each mode, what is outside the bounds, the logged sums, the loss and its gradient, and that tokens
with mask 0 (observations, padding) never enter anything, whatever their engine log-prob.
"""

from __future__ import annotations

import math

import pytest
import torch

from helpers import FAST, compose, recipe
from score_lightning.step.losses import grpo_token_loss
from score_lightning.step.rollout_correction import (RolloutCorrection, behaviour_logprobs, importance_weights,
                                                     mismatch_sums, resolve_mode, rollout_correction, weight_sums)

L2, L4 = math.log(2.0), math.log(4.0)


def _case():
    """Three rows of four tokens. Row 0: rho = 2, 4, (observation), 1/4. Row 1: rho = 1 but token 1 has no
    engine log-prob (NaN), token 3 is padding. Row 2: rho = 2, 2, 1, 1 (sequence ratio 4)."""
    old = torch.tensor([[-1.0, -0.5, -2.0, -3.0], [-1.0, -1.0, -1.0, -1.0], [-0.7, -0.2, -1.5, -0.1]])
    lr = torch.tensor([[L2, L4, 0.0, -L4], [0.0, 0.0, 0.0, 0.0], [L2, L2, 0.0, 0.0]])
    mu = old - lr
    mu[0, 2] = 50.0  # an observation token: junk that must never enter
    mu[1, 1] = math.nan  # no engine log-prob recorded
    mu[1, 3] = -80.0  # padding
    mask = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.float32)
    return old, mu, mask


@pytest.mark.parametrize("mode,weights,outside", [
    # truncate: clamp(rho, 0.5, 3); mask: rho inside [0.5, 3], 0 outside; off-mask entries are 1
    ("token_truncate", [[2, 3, 1, 0.5], [1, 1, 1, 1], [2, 2, 1, 1]], [[0, 1, 0, 1], [0, 0, 0, 0], [0, 0, 0, 0]]),
    ("token_mask", [[2, 0, 1, 0], [1, 1, 1, 1], [2, 2, 1, 1]], [[0, 1, 0, 1], [0, 0, 0, 0], [0, 0, 0, 0]]),
    # sequence ratios: row 0 = 2 * 4 * 1/4 = 2, row 1 = 1, row 2 = 2 * 2 = 4 > C_max, on every mask-1 token
    ("sequence_truncate", [[2, 2, 1, 2], [1, 1, 1, 1], [3, 3, 3, 3]], [[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]]),
    ("sequence_mask", [[2, 2, 1, 2], [1, 1, 1, 1], [0, 0, 0, 0]], [[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]]),
])
def test_weights_of_each_mode_by_hand(mode, weights, outside):
    old, mu, mask = _case()
    w = importance_weights(old, mu, mask, mode, clip_min=0.5, clip_max=3.0)
    assert torch.allclose(w.weight, torch.tensor(weights, dtype=torch.float32), atol=1e-6), w.weight
    assert w.outside.tolist() == [[bool(x) for x in r] for r in outside]
    assert not w.weight.requires_grad


def test_no_lower_bound_keeps_small_ratios():
    old, mu, mask = _case()
    assert importance_weights(old, mu, mask, "token_truncate", None, 3.0).weight[0, 3] == pytest.approx(0.25)
    assert importance_weights(old, mu, mask, "token_mask", None, 3.0).weight[0, 3] == pytest.approx(0.25)


def test_logged_sums_by_hand():
    old, mu, mask = _case()
    s = mismatch_sums(old, mu, mask)
    # valid tokens: row 0 tokens 0, 1, 3; row 1 tokens 0, 2 (1 has no log-prob, 3 is padding); row 2 all four
    assert s["tokens"] == 9
    def k3(r: float) -> float:  # KL(mu || pi_old) per token, r = pi_old / mu
        return r - 1 - math.log(r)

    assert s["k3"] == pytest.approx(k3(2) + k3(4) + k3(0.25) + 2 * k3(2), abs=1e-5)
    assert s["k1"] == pytest.approx(-(L2 + L4 - L4 + 2 * L2), abs=1e-5)  # -sum log rho = -3 ln 2
    trunc = weight_sums(importance_weights(old, mu, mask, "token_truncate", 0.5, 3.0))
    assert trunc == pytest.approx({"weight": (2 + 3 + 0.5) + (1 + 1) + (2 + 2 + 1 + 1), "outside": 2})
    seq = weight_sums(importance_weights(old, mu, mask, "sequence_mask", 0.5, 3.0))
    assert seq == pytest.approx({"weight": 3 * 2 + 2 * 1 + 0, "outside": 4})


def test_observation_tokens_never_enter():
    """Changing every mask-0 entry (the engine's log-prob, the trainer's) changes no weight on a model token, no sum."""
    old, mu, mask = _case()
    old2, mu2 = old.clone(), mu.clone()
    off = mask == 0
    old2[off], mu2[off] = -1e4, 1e4
    for mode in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
        a, b = (importance_weights(o, m, mask, mode, 0.5, 3.0) for o, m in ((old, mu), (old2, mu2)))
        assert torch.equal(a.weight, b.weight) and torch.equal(a.outside, b.outside)
        assert weight_sums(a) == weight_sums(b)
    assert mismatch_sums(old, mu, mask) == mismatch_sums(old2, mu2, mask)


def test_sequence_ids_join_the_rows_of_one_trajectory():
    """Two MaMs role calls of one trajectory, each with rho = 2: the trajectory's ratio is 4 (masked at C_max 3)."""
    old = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
    mu = old - torch.tensor([[L2, 0.0], [L2, 0.0]])
    mask = torch.ones(2, 2)
    alone = importance_weights(old, mu, mask, "sequence_mask", None, 3.0)
    joined = importance_weights(old, mu, mask, "sequence_mask", None, 3.0, sequence_ids=torch.tensor([0, 0]))
    assert torch.allclose(alone.weight, torch.full((2, 2), 2.0)) and torch.equal(joined.weight, torch.zeros(2, 2))


def test_behaviour_logprobs_follow_the_token_batch_layout():
    class Row:
        def __init__(self, p, r, lps):
            self.prompt_ids, self.response_ids, self.engine_logprobs = p, r, lps

    rows = [Row([1, 2, 3], [4, 5], [-0.1, -0.2]), Row([1], [6, 7, 8], [-0.3, -0.4, -0.5]), Row([1, 2], [9], [])]
    out = behaviour_logprobs(rows, (3, 4))
    # response token j at column len(prompt) - 1 + j; a row without one log-prob per token stays NaN
    assert out[0, 2:4].tolist() == pytest.approx([-0.1, -0.2]) and out[0, :2].isnan().all()
    assert out[1, 0:3].tolist() == pytest.approx([-0.3, -0.4, -0.5]) and out[1, 3].isnan()
    assert out[2].isnan().all()


def test_loss_weights_the_surrogate_not_the_kl():
    """On-policy (ratio 1, no clipping) the per-token surrogate is -A: with weights w the loss is -sum A w and its
    gradient at token t is -A w_t + kl_coef (1 - exp(ref - logp)): the KL's gradient is the unweighted one."""
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    ref = torch.tensor([[-1.5, -2.0, -0.2]])
    w = torch.tensor([[2.0, 0.0, 0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    a, beta = torch.tensor([1.5]), 0.1
    loss, st = grpo_token_loss(logp, logp.detach(), ref, a, mask, clip_low=0.2, clip_high=0.2, kl_coef=beta,
                               is_weight=w)
    def k3(d: float) -> float:  # d = ref - logp
        return math.exp(d) - d - 1

    assert float(loss.detach()) == pytest.approx(-1.5 * 2.0 - 1.5 * 0.0 + beta * (k3(-0.5) + k3(0.0)), abs=1e-6)
    assert float(st["pg"]) == pytest.approx(-3.0) and float(st["kl"]) == pytest.approx(k3(-0.5) + k3(0.0), abs=1e-6)
    loss.backward()
    expect = [-1.5 * 2.0 + beta * (1 - math.exp(-0.5)), -1.5 * 0.0 + beta * (1 - 1.0), 0.0]
    assert logp.grad[0].tolist() == pytest.approx(expect, abs=1e-6)


def test_kl_is_weighted_changes_the_gradient_not_the_value():
    """loss.kl_is_weighted: KL x pi_theta / pi_old. On-policy its value is 1; d/dlogp [ratio k3] = k3 + 1 - exp(d)."""
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0]])
    mask = torch.ones(1, 2)
    plain, _ = grpo_token_loss(logp, logp.detach(), ref, torch.tensor([0.0]), mask, clip_low=0.2, clip_high=0.2,
                               kl_coef=1.0)
    weighted, _ = grpo_token_loss(logp, logp.detach(), ref, torch.tensor([0.0]), mask, clip_low=0.2, clip_high=0.2,
                                  kl_coef=1.0, kl_is_weighted=True)
    assert float(weighted.detach()) == pytest.approx(float(plain.detach()), abs=1e-7)
    (g,) = torch.autograd.grad(weighted, logp)
    d = [-0.5, 1.0]  # ref - logp; k3 + 1 - exp(d) = -d = log pi - log ref: the reverse-KL gradient
    assert g[0].tolist() == pytest.approx([math.exp(x) - x - 1 + 1 - math.exp(x) for x in d], abs=1e-6)
    assert g[0].tolist() == pytest.approx([0.5, -1.0], abs=1e-6)


def test_auto_follows_the_engine():
    assert resolve_mode("auto", "vllm") == "token_truncate"
    assert resolve_mode("auto", "hf") == "none" and resolve_mode("auto", "scripted") == "none"
    assert resolve_mode("sequence_mask", "hf") == "sequence_mask"
    with pytest.raises(ValueError):
        resolve_mode("tis", "vllm")
    qwen, tiny = compose([*recipe("qwen_score")]), compose(FAST)
    vllm = rollout_correction(qwen.optim, qwen.loss, qwen.rollout)
    assert vllm == RolloutCorrection("token_truncate", None, 3.0, False)
    assert not rollout_correction(tiny.optim, tiny.loss, tiny.rollout).active  # tiny_score: rollout=hf
    assert vllm.outside_tag("rollout") == "rollout/is_clipped_frac"
    assert RolloutCorrection("token_mask").outside_tag("evaluator") == "evaluator/is_masked_frac"


@pytest.mark.parametrize("overrides,needle", [
    (["optim.rollout_correction=tis"], "optim.rollout_correction='tis'"),
    (["optim.rollout_correction_clip_max=null"], "optim.rollout_correction_clip_max=null: allowed a number"),
    (["optim.rollout_correction_clip_max=0.5"], "optim.rollout_correction_clip_max=0.5"),
    (["optim.rollout_correction_clip_min=1.5"], "optim.rollout_correction_clip_min=1.5"),
    (["optim.rollout_correction_clip_min=1.0", "optim.rollout_correction_clip_max=1.0"], "must be <"),
    (["loss.kl_is_weighted=maybe"], "loss.kl_is_weighted"),
    ([*recipe("qwen_score"), "solver.top_p=0.9"], "TRL #6789"),  # auto -> token_truncate under vLLM
    ([*recipe("qwen_score"), "solver.top_p=0.9", "optim.rollout_correction=sequence_mask"], "sequence_mask"),
])
def test_config_refuses_bad_values(overrides, needle):
    from helpers import refusal

    base = [] if overrides[0].startswith("experiment=") else ["experiment=tiny_score"]
    text = refusal(base + overrides)
    assert needle in text, text


def test_config_accepts_the_documented_values():
    from score_lightning.launch.config_validation import validate_config

    validate_config(compose([*recipe("qwen_score"), "solver.top_p=0.9", "optim.rollout_correction=none"]))
    validate_config(compose(["experiment=tiny_score", "optim.rollout_correction=sequence_mask",
                             "optim.rollout_correction_clip_min=0.5", "loss.kl_is_weighted=true"]))
    validate_config(compose(["experiment=smol_score", "optim.rollout_correction=token_mask"]))  # HF with top-p 0.9
