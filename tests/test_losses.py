"""Tests for score_lightning.step.losses against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from score_lightning.step.losses import (
    clipped_surrogate,
    entropy_from_logits,
    group_advantages,
    grpo_token_loss,
    k3_kl,
    masked_mean,
    masked_sum,
    reinforce_loss,
    token_logprobs,
)

LN2 = math.log(2.0)


def close(a: torch.Tensor, b, tol: float = 1e-6) -> bool:
    return torch.allclose(a.double(), torch.as_tensor(b, dtype=torch.float64), atol=tol, rtol=0)


# --------------------------------------------------------------------------- log-probs, entropy


def test_token_logprobs_by_hand_with_temperature():
    # Row 0: logits [0, ln 3] -> softmax [1/4, 3/4]; label 1 -> ln 0.75.
    # Row 1: same logits at T = 2 -> [0, ln3 / 2] -> p0 = 1 / (1 + sqrt 3); label 0.
    logits = torch.tensor([[[0.0, math.log(3.0)]], [[0.0, math.log(3.0)]]])
    labels = torch.tensor([[1], [0]])
    lp_t1 = token_logprobs(logits, labels)
    assert close(lp_t1, [[math.log(0.75)], [math.log(0.25)]])
    lp_t2 = token_logprobs(logits, labels, temperature=2.0)
    assert close(lp_t2[1], [-math.log(1.0 + math.sqrt(3.0))])  # -1.0050525...
    assert close(lp_t2[0], [0.5 * math.log(3.0) - math.log(1.0 + math.sqrt(3.0))])


def test_token_logprobs_chunking_and_ignore_index():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 4, 11, generator=g, dtype=torch.bfloat16)
    labels = torch.randint(0, 11, (5, 4), generator=g)
    ref = torch.log_softmax(logits.float(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    for rows in (1, 2, 7):
        out = token_logprobs(logits, labels, chunk_rows=rows)
        assert out.dtype == torch.float32
        assert torch.allclose(out, ref, atol=1e-6)
    labels[0, 0] = -100  # ignore index: must not crash (value is masked by callers)
    assert torch.isfinite(token_logprobs(logits, labels)).all()
    with pytest.raises(ValueError):
        token_logprobs(logits, labels, temperature=0.0)


def test_entropy_by_hand():
    # uniform over V = 5 -> ln 5; [0, ln 3] -> p = [1/4, 3/4]
    # H = .25 ln 4 + .75 ln(4/3) = 0.346574 + 0.215762 = 0.562335
    logits = torch.tensor([[[0.0] * 5], [[3.0] * 5]])
    assert close(entropy_from_logits(logits), [[math.log(5.0)], [math.log(5.0)]])
    two = torch.tensor([[[0.0, math.log(3.0)], [100.0, 100.0 + math.log(3.0)]]])
    assert close(entropy_from_logits(two), [[0.5623351, 0.5623351]], tol=1e-5)
    # the gradient (used by an entropy bonus) matches the textbook -sum p log p form
    z = torch.randn(2, 3, 6, generator=torch.Generator().manual_seed(3))
    z1, z2 = z.clone().requires_grad_(True), z.clone().requires_grad_(True)
    entropy_from_logits(z1).sum().backward()
    (-(torch.softmax(z2, -1) * torch.log_softmax(z2, -1)).sum(-1)).sum().backward()
    assert torch.allclose(z1.grad, z2.grad, atol=1e-6)


# --------------------------------------------------------------------------- advantages


def test_group_advantages_unbiased_std_by_hand():
    r = torch.tensor([1.0, 2.0, 3.0, 4.0])
    # K = 2: groups [1,2], [3,4]; mean 1.5 / 3.5; unbiased std = sqrt(.25+.25)/1 = 0.7071068
    # -> (-0.5 / 0.7071068, 0.5 / 0.7071068) = (-0.7071068, 0.7071068) per group
    s = 1.0 / math.sqrt(2.0)
    assert close(group_advantages(r, 2, eps=0.0), [-s, s, -s, s])
    # with the default eps = 1e-6: -0.5 / (0.7071068 + 1e-6) = -0.7071058
    assert close(group_advantages(r, 2), [-0.7071058, 0.7071058, -0.7071058, 0.7071058], tol=1e-6)
    # K = 4: mean 2.5, deviations (-1.5, -.5, .5, 1.5), sum of squares 5, unbiased var 5/3,
    # std 1.2909944 -> (-1.1618950, -0.3872983, 0.3872983, 1.1618950)
    adv4 = group_advantages(r, 4, eps=0.0)
    assert close(adv4, [-1.1618950, -0.3872983, 0.3872983, 1.1618950])
    # the population-std convention would give -1.5 / sqrt(1.25) = -1.3416408: not what we use
    assert not close(adv4[:1], [-1.3416408], tol=1e-3)


def test_group_advantages_without_std_is_dr_grpo():
    r = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert close(group_advantages(r, 2, normalize_std=False), [-0.5, 0.5, -0.5, 0.5])
    assert close(group_advantages(r, 4, normalize_std=False), [-1.5, -0.5, 0.5, 1.5])


def test_group_advantages_constant_group_is_exactly_zero():
    # 0.1 three times: the float mean may differ from 0.1 in the last bit; / (0 + eps) would blow
    # that up. Group [1,2,3]: mean 2, unbiased std 1 -> (-1, 0, 1).
    r = torch.tensor([0.1, 0.1, 0.1, 1.0, 2.0, 3.0, 5.0, 5.0, 5.0])
    adv = group_advantages(r, 3, eps=0.0)
    assert torch.isfinite(adv).all()
    assert torch.equal(adv[:3], torch.zeros(3)) and torch.equal(adv[6:], torch.zeros(3))
    assert close(adv[3:6], [-1.0, 0.0, 1.0])


def test_group_advantages_rejects_bad_shapes():
    with pytest.raises(ValueError):
        group_advantages(torch.tensor([1.0, 2.0]), 1)
    with pytest.raises(ValueError):
        group_advantages(torch.tensor([1.0, 2.0, 3.0]), 2)


# --------------------------------------------------------------------------- k3 KL


def test_k3_kl_by_hand():
    logp = torch.tensor([math.log(0.5), math.log(0.5), math.log(0.25), -1.3])
    ref = torch.tensor([math.log(0.5), math.log(0.25), math.log(0.5), -1.3])
    # r = ref - logp: 0 -> 0; -ln2 -> 0.5 + 0.693147 - 1 = 0.193147; +ln2 -> 2 - 0.693147 - 1
    assert close(k3_kl(logp, ref), [0.0, 0.5 + LN2 - 1.0, 2.0 - LN2 - 1.0, 0.0])


def test_k3_kl_clamps():
    logp = torch.tensor([0.0, -30.0, -3.0])
    ref = torch.tensor([-30.0, 0.0, 0.0])
    # kl_clamp off (100): r = -30 -> clamp -20 -> e^-20 + 20 - 1 = 19.0 (not 29)
    # r = +30 -> clamp 20 -> e^20 - 21 = 4.85e8 -> clamp 100; r = 3 -> e^3 - 4 = 16.0855
    out = k3_kl(logp, ref, kl_clamp=100.0)
    assert close(out, [19.0 + math.exp(-20.0), 100.0, math.exp(3.0) - 4.0], tol=1e-4)
    # log-ratio clamp 2: r = 3 -> 2 -> e^2 - 3 = 4.389056; r = -30 -> -2 -> e^-2 + 1 = 1.135335
    out = k3_kl(logp, ref, log_ratio_clamp=2.0, kl_clamp=100.0)
    assert close(out, [math.exp(-2.0) + 1.0, math.exp(2.0) - 3.0, math.exp(2.0) - 3.0], tol=1e-5)
    # both: default log-ratio clamp + kl clamp 10 -> 10 where the value exceeds it
    assert close(k3_kl(logp, ref), [10.0, 10.0, 10.0])


# --------------------------------------------------------------------------- clipped surrogate


def _lp(ratio: float) -> float:
    return math.log(ratio)


def test_clipped_surrogate_each_region_by_hand():
    ratios = [0.5, 1.5, 0.5, 1.5, 1.1, 1.1]
    adv = torch.tensor([2.0, 2.0, -2.0, -2.0, 2.0, -2.0])
    logp = torch.tensor([_lp(x) for x in ratios], requires_grad=True)
    old = torch.zeros(6)
    loss, clipped = clipped_surrogate(logp, old, adv, 0.2, 0.2)
    expected = [
        -1.0,  # A>0, ratio .5 < .8: min(1.0, 1.6) = 1.0 (unclipped)
        -2.4,  # A>0, ratio 1.5 > 1.2: min(3.0, 2.4) = 2.4 (clipped)
        1.6,  # A<0, ratio .5 < .8: min(-1.0, -1.6) = -1.6 (clipped)
        3.0,  # A<0, ratio 1.5 > 1.2: min(-3.0, -2.4) = -3.0 (unclipped)
        -2.2,  # inside the band
        2.2,  # inside the band
    ]
    assert close(loss, expected, tol=1e-6)
    assert clipped.tolist() == [0.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    # d loss / d logp = -A * ratio where unclipped, exactly 0 where clipped
    loss.sum().backward()
    assert close(logp.grad, [-1.0, 0.0, 0.0, 3.0, -2.2, 2.2], tol=1e-6)


def test_clipped_surrogate_asymmetric_clip():
    logp = torch.tensor([_lp(1.25), _lp(1.5), _lp(0.75)])
    adv = torch.tensor([1.0, 1.0, -1.0])
    loss, clipped = clipped_surrogate(logp, torch.zeros(3), adv, clip_low=0.2, clip_high=0.28)
    # 1.25 < 1.28 -> unclipped -1.25; 1.5 -> 1.28 clipped; A<0, .75 < .8 -> 0.8 clipped
    assert close(loss, [-1.25, -1.28, 0.8])
    assert clipped.tolist() == [0.0, 1.0, 1.0]
    loss_sym, clipped_sym = clipped_surrogate(logp, torch.zeros(3), adv, clip_low=0.3, clip_high=0.2)
    # symmetric-ish other way: 1.25 > 1.2 clipped -> -1.2; .75 inside [.7, 1.2] -> 0.75
    assert close(loss_sym, [-1.2, -1.2, 0.75])
    assert clipped_sym.tolist() == [1.0, 1.0, 0.0]


def test_clipped_surrogate_broadcasts_sequence_advantage():
    logp = torch.full((2, 3), _lp(1.5))
    loss, _ = clipped_surrogate(logp, torch.zeros(2, 3), torch.tensor([1.0, -1.0]))
    assert close(loss, [[-1.2] * 3, [1.5] * 3])


# --------------------------------------------------------------------------- masking, aggregation


def test_masked_mean_and_sum():
    x = torch.tensor([[1.0, 2.0, float("-inf")], [4.0, float("nan"), 6.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 1]])
    assert close(masked_sum(x, m), 13.0)
    assert close(masked_mean(x, m.float()), 13.0 / 4)
    empty = masked_mean(x, torch.zeros(2, 3))
    assert empty.item() == 0.0


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    B, T, V = 5, 6, 7
    logits = torch.randn(B, T, V, generator=g)
    labels = torch.randint(0, V, (B, T), generator=g)
    # very uneven response lengths: 1, 6, 2, 5, 3 tokens, after prompts of varying length
    mask = torch.zeros(B, T)
    for b, (start, n) in enumerate([(4, 1), (0, 6), (3, 2), (1, 5), (2, 3)]):
        mask[b, start : start + n] = 1.0
    with torch.no_grad():
        base = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    old = base + 0.3 * torch.randn(B, T, generator=g)  # ratios spread across the clip band
    ref = base + 0.5 * torch.randn(B, T, generator=g)
    adv = torch.tensor([1.5, -0.7, 0.4, -1.2, 0.9])
    return logits, labels, mask, old, ref, adv


def _reference_token_mean(logits, labels, mask, old, ref, adv, eps, kl_coef):
    """Full-batch token-mean loss written out independently of the library."""
    logp = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - old)
    a = adv[:, None]
    pg = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - eps, 1 + eps) * a)
    r = ref - logp
    kl = torch.exp(r) - r - 1
    per_tok = pg + kl_coef * kl
    return per_tok[mask.bool()].mean()


def test_global_token_mean_over_uneven_micro_batches():
    logits, labels, mask, old, ref, adv = _batch()
    kw = dict(clip_low=0.2, clip_high=0.2, kl_coef=0.05)

    full_logits = logits.clone().requires_grad_(True)
    expected = _reference_token_mean(full_logits, labels, mask, old, ref, adv, 0.2, 0.05)
    expected.backward()

    acc_logits = logits.clone().requires_grad_(True)
    splits = [(0, 1), (1, 4), (4, 5)]  # micro-batch sizes 1, 3, 1 -> 1, 13, 3 tokens
    n_global = mask.sum()
    assert n_global.item() == 17.0
    total = torch.zeros(())
    naive = torch.zeros(())
    tokens = torch.zeros(())
    for lo, hi in splits:
        logp = token_logprobs(acc_logits[lo:hi], labels[lo:hi])
        loss_sum, stats = grpo_token_loss(logp, old[lo:hi], ref[lo:hi], adv[lo:hi], mask[lo:hi], **kw)
        micro = loss_sum / n_global
        micro.backward()  # gradient accumulation, as the module does
        total = total + micro.detach()
        naive = naive + (loss_sum / stats["tokens"]).detach() / len(splits)
        tokens = tokens + stats["tokens"]

    assert tokens.item() == 17.0
    assert torch.allclose(total, expected.detach(), atol=1e-6)
    assert torch.allclose(acc_logits.grad, full_logits.grad, atol=1e-7)
    # the naive mean of per-micro-batch means weights tokens unequally: clearly different
    assert abs(naive.item() - expected.item()) > 1e-2


def test_grpo_stats_are_masked_sums():
    logp = torch.tensor([[_lp(1.5), _lp(0.5), 0.0]])
    old = torch.zeros(1, 3)
    ref = torch.tensor([[_lp(1.5) - LN2, 0.0, 5.0]])  # r = -ln2 at token 0; token 2 masked
    ent = torch.tensor([[1.0, 2.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss_sum, st = grpo_token_loss(
        logp, old, ref, torch.tensor([1.0]), mask, clip_low=0.2, clip_high=0.2, kl_coef=0.1,
        entropy_coef=0.01, entropy=ent,
    )
    # pg: token0 ratio 1.5 clipped -> -1.2; token1 ratio .5 -> -0.5. sum -1.7
    # kl: token0 0.193147; token1 r = 0 - ln .5 = ln2 -> 2 - ln2 - 1 = 0.306853; sum 0.5
    # entropy sum 3; loss = -1.7 + 0.1 * 0.5 - 0.01 * 3 = -1.68
    assert close(st["pg"], -1.7)
    assert close(st["kl"], 0.5)
    assert close(st["clipfrac"], 1.0)
    assert close(st["entropy"], 3.0)
    assert close(st["tokens"], 2.0)
    assert close(loss_sum, -1.68)
    no_kl, st2 = grpo_token_loss(logp, old, None, torch.tensor([1.0]), mask, clip_low=0.2, clip_high=0.2, kl_coef=0.1)
    assert close(no_kl, -1.7) and close(st2["kl"], 0.0)
    with pytest.raises(ValueError):
        grpo_token_loss(logp, old, ref, torch.tensor([1.0]), mask, clip_low=0.2, clip_high=0.2, kl_coef=0.1, entropy_coef=0.1)


def test_gradient_reaches_only_response_tokens():
    logits, labels, mask, old, ref, adv = _batch(seed=1)
    labels[mask == 0] = -100  # padding / prompt labels as a collator would set them
    logits.requires_grad_(True)
    logp = token_logprobs(logits, labels)
    ent = entropy_from_logits(logits)
    loss_sum, _ = grpo_token_loss(
        logp, old, ref, adv, mask, clip_low=0.2, clip_high=0.28, kl_coef=0.05, entropy_coef=0.01, entropy=ent
    )
    (loss_sum / mask.sum()).backward()
    g = logits.grad
    assert torch.count_nonzero(g[mask == 0]) == 0  # exactly zero, not merely small
    per_pos = g.abs().sum(-1)
    assert (per_pos[mask == 1] > 0).all()


# --------------------------------------------------------------------------- REINFORCE


def test_reinforce_loss_value_and_sign():
    seq = torch.tensor([-2.0, -4.0])
    # -alpha * A * mean(seq) = -2 * 0.5 * (-3) = 3.0
    assert close(reinforce_loss(seq, 0.5, alpha=2.0), 3.0)
    assert close(reinforce_loss(seq, torch.tensor([1.0, -1.0])), (2.0 - 4.0) / 2)  # (-(-2) + -(4)) / 2 = -1
    a = torch.tensor(1.0, requires_grad=True)
    seq_g = seq.clone().requires_grad_(True)
    reinforce_loss(seq_g, a).backward()
    assert a.grad is None  # the advantage is a reward, a constant: no gradient flows into it
    assert close(seq_g.grad, [-0.5, -0.5])  # d/d seq_b of -A * mean = -1/2


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_reinforce_step_moves_sequence_logprob_with_advantage_sign(advantage):
    # unigram softmax policy over V = 3, uniform start; the sampled "rubric" is tokens (0, 0, 2).
    # d/dθ Σ log p = counts - n p = (2, 0, 1) - 3 (1/3, 1/3, 1/3) = (1, -1, 0)
    # SGD on -A Σ log p with lr 0.1 -> θ = 0.1 A (1, -1, 0)
    theta = torch.zeros(3, requires_grad=True)
    tokens = torch.tensor([0, 0, 2])

    def seq_logp():
        return torch.log_softmax(theta, -1)[tokens].sum().unsqueeze(0)

    before = seq_logp().item()  # 3 ln(1/3) = -3.295837
    assert math.isclose(before, -3 * math.log(3.0), rel_tol=1e-6)
    opt = torch.optim.SGD([theta], lr=0.1)
    reinforce_loss(seq_logp(), advantage).backward()
    opt.step()
    assert close(theta.detach(), [0.1 * advantage, -0.1 * advantage, 0.0])
    after = seq_logp().item()
    assert (after - before) * advantage > 0


def test_group_advantages_over_included_rollouts_by_hand():
    """evaluator.on_incomplete=drop: excluded rollouts neither shape their group's mean and std nor get an advantage."""
    rewards = torch.tensor([1.0, 3.0, 100.0, 2.0, 5.0, 5.0, 7.0, 9.0])
    include = torch.tensor([True, True, False, True, True, True, False, False])
    adv = group_advantages(rewards, 4, include=include)
    mean, std = 2.0, 1.0  # of 1, 3, 2 (unbiased std)
    assert adv[:4].tolist() == pytest.approx([(1 - mean) / (std + 1e-6), (3 - mean) / (std + 1e-6), 0.0, 0.0], abs=1e-6)
    assert adv[4:].tolist() == [0.0] * 4  # two included, equal rewards: no signal; the excluded get 0
    assert group_advantages(rewards, 4, include=torch.ones(8, dtype=torch.bool)).tolist() == \
        pytest.approx(group_advantages(rewards, 4).tolist())
    single = group_advantages(torch.tensor([1.0, 2.0]), 2, include=torch.tensor([True, False]))
    assert single.tolist() == [0.0, 0.0]  # one included rollout has nothing to be relative to
