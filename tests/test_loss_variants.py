"""The solver's loss variants (``optim.loss_type``) and their options, against numbers worked out by hand.

Pure functions first (surrogates, normalisers, reward scaling, the overlong penalty), then the glue: that
``solver_update`` accumulates micro-batches into exactly each variant's definition, that a truncated
trajectory leaves the loss, and that the overlong penalty reaches the advantages. Equality with TRL 1.16's
own loss code is in tests/test_loss_trl.py; each variant training tiny_score from the CLI is at the end.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time

import pytest
import torch

from helpers import ROOT, compose, plain_grpo, read_scalars, refusal
from score_lightning.registry import Registry
from score_lightning.step.loss_registry import (NORMALISERS, POLICY_LOSSES, REWARD_SCALINGS, PolicyLoss, loss_scale,
                                                policy_loss, scaled_advantages)
from score_lightning.step.loss_variants import (cispo_surrogate, gspo_surrogate, overlong_penalty, ppo_clip_surrogate,
                                                sequence_log_ratio)
from score_lightning.step.losses import grpo_token_loss

LOSS_TYPES = tuple(POLICY_LOSSES.names())  # every registered optim.loss_type
BUILT_IN = "bnpo, cispo, dapo, dr_grpo, grpo, grpo_seq_mean, gspo"

MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
LOGP = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -1.1, -3.0]])
DIFF = torch.tensor([[0.1, -0.2, 0.4], [0.3, 0.5, 9.0]])  # log pi - log pi_old; the 9 sits on a masked token
OLD = LOGP - DIFF


def close(a, b, tol: float = 1e-6) -> bool:
    return torch.allclose(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64), atol=tol,
                          rtol=0)


# --------------------------------------------------------------------------- surrogates


def test_gspo_sequence_ratio_value_and_gradient_by_hand():
    # row 0: mean log-ratio (0.1 - 0.2 + 0.4) / 3 = 0.1 -> s0 = e^0.1 = 1.105171, inside [0.8, 1.2]: loss -A s0
    # row 1: (0.3 + 0.5) / 2 = 0.4 (the masked 9 does not count) -> s1 = e^0.4 = 1.491825 > 1.2 with A > 0: clipped
    assert close(sequence_log_ratio(LOGP, OLD, MASK), [[0.1], [0.4]])
    logp = LOGP.clone().requires_grad_(True)
    adv = torch.tensor([1.0, 0.5])
    loss, clipped, ratio = gspo_surrogate(logp, OLD, adv, MASK, 0.2, 0.2)
    s0, s1 = math.exp(0.1), math.exp(0.4)
    assert close(ratio[:, :2], [[s0, s0], [s1, s1]])
    assert close(loss[0], [-s0] * 3) and close(loss[1, :2], [-0.6, -0.6])  # row 1: -A * 1.2
    assert clipped.tolist() == [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]
    # the objective: mean over the 2 sequences of each one's token mean
    total, st = policy_loss(logp, OLD, None, adv, MASK, loss_type="gspo", clip_low=0.2, clip_high=0.2, kl_coef=0.0)
    assert close(total, -s0 - 0.6) and st["sequences"].item() == 2.0 and st["tokens"].item() == 5.0
    (total / 2).backward()
    # d/dlogp_t of (1/|y|) sum_t -A sg[s] exp(logp_t - sg logp_t) = -A s / |y|; the clipped row has none
    assert close(logp.grad, [[-s0 / 3 / 2] * 3, [0.0, 0.0, 0.0]])


def test_gspo_token_form_equals_the_sequence_objective_with_one_advantage_per_sequence():
    """GSPO-token's gradient equals GSPO's (TRL's exp(mean log r) with its gradient) for sequence advantages."""
    g = torch.Generator().manual_seed(0)
    logp0 = -torch.rand(3, 5, generator=g) * 2
    old = logp0 - 0.05 * torch.randn(3, 5, generator=g)
    mask = torch.tensor([[1.0] * 5, [1.0, 1, 1, 0, 0], [0.0, 1, 1, 1, 1]])
    adv = torch.tensor([0.7, -1.3, 0.4])
    a = logp0.clone().requires_grad_(True)
    total, _ = policy_loss(a, old, None, adv, mask, loss_type="gspo", clip_low=0.2, clip_high=0.2, kl_coef=0.0)
    total.backward()
    b = logp0.clone().requires_grad_(True)
    n = mask.sum(-1)
    s = torch.exp(((b - old) * mask).sum(-1) / n)
    seq = -torch.minimum(s * adv, s.clamp(0.8, 1.2) * adv)
    seq.sum().backward()
    assert close(total, seq.sum()) and close(a.grad, b.grad * mask)


def test_cispo_keeps_a_gradient_where_the_ppo_clip_zeroes_it():
    # row 0: r = e^[0.1, -0.2, 0.4] = [1.105171, 0.818731, 1.491825]; w = clip(r, 0.8, 1.2) = [1.105171, 0.818731, 1.2]
    logp = LOGP.clone().requires_grad_(True)
    adv = torch.tensor([1.0, -0.5])
    loss, clipped, _ = cispo_surrogate(logp, OLD, adv, MASK, 0.2, 0.2)
    w0 = [math.exp(0.1), math.exp(-0.2), 1.2]
    w1 = [1.2, 1.2]  # e^0.3 = 1.35, e^0.5 = 1.65: both clipped at 1.2
    assert close(loss[0], [-w * 1.0 * lp for w, lp in zip(w0, [-1.0, -2.0, -0.5])])
    assert close(loss[1, :2], [-w * -0.5 * lp for w, lp in zip(w1, [-0.7, -1.1])])
    assert clipped[0].tolist() == [0.0, 0.0, 1.0] and clipped[1, :2].tolist() == [1.0, 1.0]
    total, _ = policy_loss(logp, OLD, None, adv, MASK, loss_type="cispo", clip_low=0.2, clip_high=0.2, kl_coef=0.0)
    (total / 5).backward()
    # d/dlogp (-sg[w] A logp) = -w A: non-zero on the clipped token (1.2), where -min(rA, clip(r)A) has none
    assert close(logp.grad, [[-w / 5 for w in w0], [0.5 * 1.2 / 5, 0.5 * 1.2 / 5, 0.0]])
    # clip_low = 1: no lower bound (TRL 1.16 clamps only above, at epsilon_high = 1 + clip_high)
    _, low, _ = cispo_surrogate(LOGP, LOGP + 1.0, adv, MASK, 1.0, 0.2)  # r = e^-1 = 0.37 < 0.8
    assert low[MASK.bool()].sum() == 0


def test_grpo_seq_mean_by_hand_is_the_mean_of_each_sequences_token_mean():
    # row 0 (A = 1): r = e^[0.1, -0.2, 0.4] = [1.105171, 0.818731, 1.491825]; the last is clipped to 1.2
    # row 1 (A = 0.5): r = e^0.3, e^0.5 > 1.2, both clipped: -0.5 * 1.2 = -0.6 each; the masked 9 does not count
    logp = LOGP.clone().requires_grad_(True)
    adv = torch.tensor([1.0, 0.5])
    r0 = [math.exp(0.1), math.exp(-0.2), 1.2]
    total, st = policy_loss(logp, OLD, None, adv, MASK, loss_type="grpo_seq_mean", clip_low=0.2, clip_high=0.2,
                            kl_coef=0.0)
    seq_means = [-sum(r0) / 3, -0.6]  # -1.041301, -0.6
    assert close(total, sum(seq_means)) and st["sequences"].item() == 2.0
    assert close(st["loss"], -sum(r0) - 1.2)  # the logged per-token loss stays a masked token sum
    scaled = total * loss_scale("grpo_seq_mean", world=1, mini_tokens=5.0, mini_sequences=2.0)
    assert close(scaled, -0.8206505)  # (-1.041301 - 0.6) / 2
    grpo, _ = policy_loss(LOGP, OLD, None, adv, MASK, loss_type="grpo", clip_low=0.2, clip_high=0.2, kl_coef=0.0)
    assert close(grpo / 5, -0.8647804)  # the token mean: (-3.123902 - 1.2) / 5, not the same objective
    scaled.backward()
    # d/dlogp_t of -A r_t / |y| / 2 on the unclipped tokens of row 0; the clipped ones have none
    assert close(logp.grad, [[-r0[0] / 6, -r0[1] / 6, 0.0], [0.0, 0.0, 0.0]])


def test_the_grpo_family_is_grpo_token_loss_bit_for_bit():
    """grpo, bnpo, dr_grpo and dapo differ only in the normaliser: the numerator is grpo_token_loss's sum."""
    g = torch.Generator().manual_seed(1)
    logp, old, ref = (-torch.rand(4, 6, generator=g) for _ in range(3))
    mask = (torch.rand(4, 6, generator=g) > 0.3).float()
    adv, ent, w = torch.randn(4, generator=g), torch.rand(4, 6, generator=g), torch.rand(4, 6, generator=g) + 0.5
    kw = dict(clip_low=0.2, clip_high=0.28, kl_coef=0.05, entropy_coef=0.01, entropy=ent, is_weight=w, kl_is_weighted=True)
    want, _ = grpo_token_loss(logp, old, ref, adv, mask, **kw)
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
        got, st = policy_loss(logp, old, ref, adv, mask, loss_type=loss_type, **kw)
        assert torch.equal(got, want) and torch.equal(st["loss"], want)


def test_the_rollout_weight_multiplies_the_policy_term_only_and_the_kl_follows_the_surrogates_ratio():
    ref = LOGP - 0.2  # k3 = e^-0.2 + 0.2 - 1 = 0.018731 per token
    k3 = math.exp(-0.2) + 0.2 - 1.0
    w = torch.full_like(LOGP, 0.5)
    adv = torch.tensor([1.0, 0.5])
    for loss_type in ("gspo", "cispo"):
        plain, st = policy_loss(LOGP, OLD, ref, adv, MASK, loss_type=loss_type, clip_low=0.2, clip_high=0.2, kl_coef=0.1)
        weighted, st_w = policy_loss(LOGP, OLD, ref, adv, MASK, loss_type=loss_type, clip_low=0.2, clip_high=0.2,
                                     kl_coef=0.1, is_weight=w)
        assert close(st["kl"], 5 * k3) and close(st_w["pg"], 0.5 * st["pg"])
        kl_part = 0.1 * k3 * (2.0 if loss_type == "gspo" else 5.0)  # gspo: a token mean per sequence, 2 sequences
        assert close(weighted - kl_part, 0.5 * (plain - kl_part))  # the KL part is not weighted
    # loss.kl_is_weighted: GSPO weights each token's KL by s_i (TRL multiplies it by its sequence coef_1)
    unw, _ = policy_loss(LOGP, OLD, ref, adv, MASK, loss_type="gspo", clip_low=0.2, clip_high=0.2, kl_coef=0.1)
    kw, _ = policy_loss(LOGP, OLD, ref, adv, MASK, loss_type="gspo", clip_low=0.2, clip_high=0.2, kl_coef=0.1,
                        kl_is_weighted=True)
    assert close(kw - unw, 0.1 * k3 * (math.exp(0.1) - 1 + math.exp(0.4) - 1))


# --------------------------------------------------------------------------- normalisers


def test_each_normaliser_by_hand():
    # a mini-batch of 6 trajectories, 40 trained tokens in 5 sequences, of a step with 100 tokens in 2 mini-batches
    counts = dict(world=1, mini_tokens=40.0, step_tokens=100.0, mini_batches=2, mini_sequences=5.0,
                  mini_trajectories=6.0, max_len=384, micro_tokens=7.0, micro_batches=3)
    assert loss_scale("grpo", **counts) == 1 / 40 and loss_scale("cispo", **counts) == 1 / 40
    assert loss_scale("dapo", **counts) == 2 / 100  # the step's tokens per mini-batch, as TRL's num_items_in_batch
    assert loss_scale("dr_grpo", **counts) == 1 / (6 * 384)
    assert loss_scale("gspo", **counts) == 1 / 5 and loss_scale("grpo_seq_mean", **counts) == 1 / 5
    assert loss_scale("bnpo", **counts) == 1 / (7 * 3)  # its own micro-batch's mean, averaged over 3 micro-batches
    # data parallel: gradients are averaged over ranks, so a global count carries the world size; bnpo does not
    assert loss_scale("grpo", **{**counts, "world": 4}) == 4 / 40
    assert loss_scale("bnpo", **{**counts, "world": 4}) == 1 / 21
    assert loss_scale("bnpo", **{**counts, "micro_tokens": 0.0}) == 1 / 3  # an empty micro-batch: 0 / 1
    with pytest.raises(KeyError, match=f"optim.loss_type='ppo': no such entry \\(registered: {BUILT_IN}"):
        loss_scale("ppo", **counts)


# --------------------------------------------------------------------------- the registry


def _double(logp, old_logp, advantages, mask, clip_low, clip_high):
    """A plug-in's surrogate: twice PPO's clipped one."""
    loss, clipped, ratio = ppo_clip_surrogate(logp, old_logp, advantages, mask, clip_low, clip_high)
    return 2.0 * loss, clipped, ratio


@pytest.fixture
def plugin_loss(monkeypatch):
    """The built-in losses plus ``double_dr_grpo`` (a new surrogate with dr_grpo's constant), as a plug-in
    registers one; the registries the step and the config validation read are swapped for the test only."""
    from score_lightning.step import loss_registry

    reg = Registry("optim.loss_type")
    for name, entry in POLICY_LOSSES.items():
        reg.register(name, entry)
    reg.register("double_dr_grpo", PolicyLoss(_double, NORMALISERS.get("constant")))
    monkeypatch.setattr(loss_registry, "POLICY_LOSSES", reg)  # the config checks ask the registry by its module
    return reg


def test_a_registered_loss_is_the_steps_loss_with_its_normalisers_counts(plugin_loss):
    """solver_update gathers the counts the registered normaliser names (no branch on the loss's name): dr_grpo's
    constant, 4 trajectories x 8 tokens, and twice its gradient."""
    trajs = _trajs()
    rewards = torch.tensor([1.0, 0.0, 2.0, 0.5])
    lm, res, steps = _update("double_dr_grpo", trajs, rewards)
    want = _weighted_gradient(lm, trajs, res.advantages, [2 / (4 * 8)] * 4)
    for got, exp in zip(steps[0], want):
        assert torch.allclose(got, exp, atol=1e-7)
    n = [len(t.response_ids) for t in trajs]
    assert res.sums["objective"] == pytest.approx(sum(2 / 32 * k * -a for k, a in zip(n, res.advantages.tolist())))


def test_an_unknown_loss_is_refused_with_the_registered_names(plugin_loss):
    from score_lightning.launch.config_validation import ConfigError, validate_config

    with pytest.raises(KeyError, match="optim.loss_type='ppo': no such entry .*double_dr_grpo, dr_grpo, grpo, "):
        policy_loss(LOGP, OLD, None, torch.ones(2), MASK, loss_type="ppo", clip_low=0.2, clip_high=0.2, kl_coef=0.0)
    validate_config(compose(["experiment=tiny_score", "optim.loss_type=double_dr_grpo"]))
    with pytest.raises(ConfigError) as err:
        validate_config(compose(["experiment=tiny_score", "optim.loss_type=ppo"]))
    assert "optim.loss_type='ppo': allowed bnpo, cispo, dapo, double_dr_grpo, dr_grpo, grpo, grpo_seq_mean, gspo" \
        in str(err.value)


def test_each_scaling_is_a_registered_function_and_only_batch_reads_the_batch_std():
    r = torch.tensor([1.0, 2.0, 3.0, 5.0])  # K = 2: groups [1, 2], [3, 5]
    asked = []

    def std() -> float:  # solver_update's is a collective: only the scaling that needs it may call it
        asked.append(1)
        return 4.0

    assert REWARD_SCALINGS.names() == ["batch", "group", "none"]
    assert close(scaled_advantages(r, 2, "none", batch_std=std), [-0.5, 0.5, -1.0, 1.0])
    assert close(scaled_advantages(r, 2, "group", batch_std=std), [-0.707106, 0.707106, -0.707106, 0.707106], tol=1e-5)
    assert asked == []
    assert close(scaled_advantages(r, 2, "batch", eps=0.0, batch_std=std), [-0.125, 0.125, -0.25, 0.25])
    assert asked == [1]
    with pytest.raises(KeyError, match="optim.scale_rewards='rank': no such entry \\(registered: batch, group, none"):
        scaled_advantages(r, 2, "rank")


# --------------------------------------------------------------------------- rewards


def test_scale_rewards_by_hand():
    r = torch.tensor([1.0, 2.0, 3.0, 5.0, 4.0, 4.0])  # K = 2: groups [1, 2], [3, 5], [4, 4]
    assert close(scaled_advantages(r, 2, "none"), [-0.5, 0.5, -1.0, 1.0, 0.0, 0.0])
    # group: each group's unbiased std, sqrt(0.5) and sqrt(2): both give +-0.7071
    assert close(scaled_advantages(r, 2, "group"), [-0.707106, 0.707106, -0.707106, 0.707106, 0, 0], tol=1e-5)
    # batch: the std of all six rewards: mean 19/6, sum of squares of deviations 10.8333 / 5 -> std 1.471960
    std = math.sqrt(sum((x - 19 / 6) ** 2 for x in r.tolist()) / 5)
    assert abs(std - 1.471960) < 1e-6
    assert close(scaled_advantages(r, 2, "batch"), [-0.5 / std, 0.5 / std, -1 / std, 1 / std, 0, 0], tol=1e-5)
    assert close(scaled_advantages(r, 2, "batch", batch_std=2.0, eps=0.0), [-0.25, 0.25, -0.5, 0.5, 0, 0])
    # with excluded rollouts (evaluator.on_incomplete=drop) the batch std is over the included rewards
    inc = torch.tensor([True, True, True, True, False, False])
    std4 = math.sqrt(sum((x - 2.75) ** 2 for x in [1, 2, 3, 5]) / 3)
    assert close(scaled_advantages(r, 2, "batch", include=inc)[:4], [-0.5 / std4, 0.5 / std4, -1 / std4, 1 / std4],
                 tol=1e-5)


def test_overlong_penalty_by_hand():
    lengths = torch.tensor([10, 15, 17, 19, 20, 25])
    # cap 20, buffer 5: 0 up to 15 tokens, then -(len - 15) / 5, -1 at the cap and beyond
    assert close(overlong_penalty(lengths, 20, 5), [0, 0, -0.4, -0.8, -1.0, -1.0])
    assert close(overlong_penalty(lengths, 20, 5, factor=0.5), [0, 0, -0.2, -0.4, -0.5, -0.5])
    with pytest.raises(ValueError):
        overlong_penalty(lengths, 20, 0)


# --------------------------------------------------------------------------- the glue: solver_update


class _LM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16))

    def forward(self, input_ids, attention_mask=None, **_):
        return type("Out", (), {"logits": self.net(input_ids)})()


def _trajs():
    from score_lightning.rollout.trajectory import Trajectory

    lengths = [1, 4, 2, 3]  # uneven: micro-batches of 2 hold 5 and 5 tokens, rows 1 and 4 tokens long
    return [Trajectory([1, 2], [3 + (k + j) % 12 for j in range(n)], [1] * n) for k, n in enumerate(lengths)]


def _update(loss_type: str, trajs, rewards, k: int = 4, **extra):
    from score_lightning.step.solver_update import GRPOSettings, OptimizerHooks, solver_update

    lm = _LM()
    settings = GRPOSettings(k, 1.0, 1, 2, 1, 0.2, 0.2, 0.0, 10.0, 0.0, 1e-6,
                            **plain_grpo(**{"loss_type": loss_type, "max_response_tokens": 8, **extra}))
    grads, steps = [], []

    def backward(loss):
        grads.append(torch.autograd.grad(loss, list(lm.parameters())))

    def step():
        steps.append([sum(g[i] for g in grads) for i in range(len(grads[0]))])
        grads.clear()
        return 0.0, True

    res = solver_update(lm, None, trajs, rewards, settings, 0, OptimizerHooks(backward, step, torch.device("cpu")))
    return lm, res, steps


def _weighted_gradient(lm, trajs, adv, weights):
    """The gradient of sum_t w_t * (-A) * log pi(t) over every response token: on-policy (ratio 1) it is each
    variant's gradient, with w_t its normaliser's weight on token t."""
    from score_lightning.step.batching import build_token_batch, policy_logprobs

    batch = build_token_batch([t.prompt_ids for t in trajs], [t.response_ids for t in trajs],
                              [t.response_mask for t in trajs], 0)
    logp, _ = policy_logprobs(lm, batch)
    w = torch.zeros_like(batch.loss_mask)
    for i, t in enumerate(trajs):
        w[i, 1:1 + len(t.response_ids)] = weights[i]
    return torch.autograd.grad((-adv[:, None] * logp * w * batch.loss_mask).sum(), list(lm.parameters()))


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_micro_batches_accumulate_to_each_variants_definition(loss_type):
    trajs = _trajs()
    rewards = torch.tensor([1.0, 0.0, 2.0, 0.5])
    lm, res, steps = _update(loss_type, trajs, rewards)
    assert len(steps) == 1 and res.sums["tokens"] == 10
    n = [len(t.response_ids) for t in trajs]  # 1, 4, 2, 3
    weights = {"grpo": [1 / 10] * 4, "dapo": [1 / 10] * 4, "cispo": [1 / 10] * 4,
               "bnpo": [1 / (5 * 2)] * 4,  # micro-batches [1, 4] and [2, 3]: 5 tokens each, 2 micro-batches
               "dr_grpo": [1 / (4 * 8)] * 4,  # 4 trajectories x solver.max_response_tokens=8
               "gspo": [1 / (4 * k) for k in n],  # a token mean per sequence, then over 4 sequences
               "grpo_seq_mean": [1 / (4 * k) for k in n]}[loss_type]
    want = _weighted_gradient(lm, trajs, res.advantages, weights)
    for got, exp in zip(steps[0], want):
        assert torch.allclose(got, exp, atol=1e-7), loss_type
    if loss_type != "cispo":  # on-policy every ratio is 1, so the objective is sum_t w_t * (-A); cispo's is -A log pi
        objective = sum(w * k * -a for w, k, a in zip(weights, n, res.advantages.tolist()))
        assert res.sums["objective"] == pytest.approx(objective, abs=1e-6) and res.sums["steps"] == 1.0


def test_bnpo_depends_on_the_micro_batch_where_grpo_does_not():
    trajs = _trajs()
    rewards = torch.tensor([1.0, 0.0, 2.0, 0.5])
    lm, _, bnpo = _update("bnpo", [trajs[i] for i in (0, 2, 1, 3)], rewards[[0, 2, 1, 3]])
    _, _, bnpo2 = _update("bnpo", trajs, rewards)
    assert not all(torch.allclose(a, b, atol=1e-6) for a, b in zip(bnpo[0], bnpo2[0]))  # 3 + 7 tokens vs 5 + 5


def test_dapo_divides_every_mini_batch_by_the_steps_tokens_per_mini_batch():
    from score_lightning.rollout.trajectory import Trajectory

    trajs = _trajs() + [Trajectory([1, 2], [5, 6, 7, 8, 9, 10], [1] * 6), Trajectory([1, 2], [4], [1])]
    rewards = torch.tensor([1.0, 0.0, 2.0, 0.5, 0.0, 1.0])
    _, dapo, d_steps = _update("dapo", trajs, rewards, k=2)
    _, grpo, g_steps = _update("grpo", trajs, rewards, k=2)
    assert len(d_steps) == 3  # 3 queries, one per mini-batch: 17 tokens in all, 5, 5 and 7 per mini-batch
    # dapo's step weighs every token 3 / 17; grpo's mini-batch j weighs them 1 / n_j
    for j, n_j in enumerate((5, 5, 7)):
        for d, g in zip(d_steps[j], g_steps[j]):
            assert torch.allclose(d, g * n_j * 3 / 17, atol=1e-7)


def test_a_truncated_trajectory_leaves_the_loss_but_not_its_group():
    trajs = _trajs()
    trajs[1].truncated = True
    rewards = torch.tensor([1.0, 0.0, 2.0, 0.5])
    _, kept, _ = _update("grpo", trajs, rewards)
    lm, masked, steps = _update("grpo", trajs, rewards, mask_truncated=True)
    assert kept.sums["tokens"] == 10 and masked.sums["tokens"] == 6  # its 4 tokens count nowhere
    assert torch.equal(kept.advantages, masked.advantages)  # it still took part in the group's mean and std
    want = _weighted_gradient(lm, trajs, masked.advantages, [1 / 6, 0.0, 1 / 6, 1 / 6])
    for got, exp in zip(steps[0], want):
        assert torch.allclose(got, exp, atol=1e-7)


def test_the_overlong_penalty_reaches_the_advantages():
    from score_lightning.step.solver_update import OverlongShaping

    trajs = _trajs()  # 1, 4, 2, 3 response tokens; cap 4, buffer 2: penalties 0, -1, 0, -0.5
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0])  # no signal without the penalty
    _, res, _ = _update("grpo", trajs, rewards, overlong=OverlongShaping(4, 2))
    assert close(res.overlong, [0.0, -1.0, 0.0, -0.5])
    shaped = torch.tensor([1.0, 0.0, 1.0, 0.5])
    assert close(res.advantages, scaled_advantages(shaped, 4, "group"))
    assert res.advantages[1] < 0 < res.advantages[0]


def _mams_trajs():
    """Four MaMs-shaped trajectories of 1, 3, 2 and 1 role calls (one training row each), 1 to 3 tokens a call."""
    from score_lightning.rollout.trajectory import Segment, Trajectory

    calls = [[2], [1, 3, 2], [2, 1], [3]]
    out = []
    for k, lengths in enumerate(calls):
        t = Trajectory(prompt_ids=[])
        for j, n in enumerate(lengths):
            t.add_segment(Segment("state", 0, [1, 2 + j], [3 + (k + j + i) % 12 for i in range(n)], [1] * n, [0.0] * n))
        out.append(t)
    return out


def test_dr_grpo_under_mams_divides_by_trajectories_times_the_whole_trajectorys_budget():
    """Dr. GRPO's sequence under MaMs is the trajectory: its constant is (trajectories) x (the most tokens its role
    calls can generate), not solver.max_response_tokens (which no MaMs trajectory obeys) and not per role call."""
    from score_lightning.step.batching import build_token_batch, policy_logprobs
    from score_lightning.step.solver_update import trajectory_cap

    cfg = compose(["experiment=mams_tiny", "optim.loss_type=dr_grpo", "solver.max_tool_calls=2",
                   "solver.max_response_tokens=256", "solver.mams.search_tokens=40", "solver.mams.state_tokens=100",
                   "solver.mams.report_tokens=150", "solver.mams.chunk_tokens=64",
                   "solver.mams.max_observation_tokens=130"])
    # a turn: 40 search + ceil(130 / 64) = 3 state calls x 100 + 150 report = 490 tokens; 2 turns = 980
    assert _settings(cfg).max_response_tokens == trajectory_cap(cfg.solver) == 980
    react = compose(["experiment=tiny_score", "optim.loss_type=dr_grpo", "solver.max_response_tokens=256"])
    assert _settings(react).max_response_tokens == 256
    trajs = _mams_trajs()
    lm, res, steps = _update("dr_grpo", trajs, torch.tensor([1.0, 0.0, 2.0, 0.5]), max_response_tokens=980)
    rows = [r for t in trajs for r in t.rows()]
    batch = build_token_batch([r.prompt_ids for r in rows], [r.response_ids for r in rows],
                              [r.response_mask for r in rows], 0)
    logp, _ = policy_logprobs(lm, batch)
    adv = res.advantages[torch.tensor([i for i, t in enumerate(trajs) for _ in t.rows()])]
    # every token of every row weighs 1 / (4 trajectories x 980), however many rows its trajectory has
    want = torch.autograd.grad((-adv[:, None] * logp * batch.loss_mask).sum() / (4 * 980), list(lm.parameters()))
    assert len(steps) == 1 and res.sums["tokens"] == 14  # 2 + (1 + 3 + 2) + (2 + 1) + 3
    for got, exp in zip(steps[0], want):
        assert torch.allclose(got, exp, atol=1e-8)


def test_gspo_under_mams_is_refused_by_name():
    from score_lightning.launch.config_validation import ConfigError, validate_config

    with pytest.raises(ConfigError) as err:
        validate_config(compose(["experiment=mams_tiny", "optim.loss_type=gspo"]))
    assert "optim.loss_type=gspo with solver.agent=mams" in str(err.value)
    assert "solver.agent=react" in str(err.value)
    with pytest.raises(ConfigError) as err:  # a token mean per row would be per role call
        validate_config(compose(["experiment=mams_tiny", "optim.loss_type=grpo_seq_mean"]))
    assert "optim.loss_type=grpo_seq_mean with solver.agent=mams" in str(err.value)
    assert "one of bnpo, cispo, dapo, dr_grpo, grpo (dr_grpo's" in str(err.value)
    for ok in (["experiment=mams_tiny", "optim.loss_type=dr_grpo"], ["experiment=tiny_score", "optim.loss_type=gspo"]):
        validate_config(compose(ok))


# --------------------------------------------------------------------------- config and the CLI


def test_unknown_values_and_what_does_not_apply_are_refused_by_name():
    from score_lightning.launch.config_validation import ConfigError, validate_config

    msg = refusal(["experiment=tiny_score", "optim.loss_type=ppo", "optim.scale_rewards=rank",
                   "optim.clip_ratio_low=1.5", "solver.mask_truncated=maybe"])
    assert f"optim.loss_type='ppo': allowed {BUILT_IN}" in msg  # the registry's names
    assert "optim.scale_rewards='rank': allowed batch, group, none" in msg
    assert "optim.clip_ratio_low=1.5" in msg and "solver.mask_truncated=maybe: allowed true or false" in msg
    with pytest.raises(ConfigError) as err:
        validate_config(compose(["experiment=tiny_score", "reward.overlong.enabled=true", "solver.agent=mams",
                                 "reward.overlong.buffer_len=100000", "optim.scale_rewards=batch"]))
    msg = str(err.value)
    assert "reward.overlong.enabled=true with solver.agent=mams" in msg
    assert "reward.overlong.buffer_len=100000: allowed null or an integer in [1, solver.max_response_tokens=" in msg


def _settings(cfg):
    from score_lightning.step.rollout_correction import rollout_correction
    from score_lightning.step.solver_update import grpo_settings

    correction = rollout_correction(cfg.optim, cfg.loss, cfg.rollout)
    return grpo_settings(cfg.solver, cfg.optim, cfg.loss, cfg.reward, correction)


def test_the_clip_and_the_scale_are_read_from_optim_only():
    s = _settings(compose(["experiment=tiny_score", "optim.clip_ratio_high=0.28", "optim.scale_rewards=none"]))
    assert (s.clip_low, s.clip_high, s.scale_rewards, s.loss_type) == (0.2, 0.28, "none", "grpo")
    assert "clip_ratio_high" not in compose(["experiment=tiny_score"]).loss  # the old alias is gone from loss
    s = _settings(compose(["experiment=tiny_score", "optim.clip_ratio_high=0.28", "optim.loss_type=gspo",
                           "reward.overlong.enabled=true", "solver.mask_truncated=true"]))
    assert (s.clip_high, s.loss_type, s.mask_truncated, s.overlong.buffer_len) == (0.28, "gspo", True, 384 // 5)


def test_cli_refuses_an_unknown_loss_type_within_seconds(tmp_path):
    t0 = time.time()
    proc = subprocess.run([sys.executable, "src/train.py", "experiment=tiny_score", "optim.loss_type=ppo",
                           f"paths.output_dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    out = proc.stderr + proc.stdout
    assert proc.returncode == 2 and f"optim.loss_type='ppo': allowed {BUILT_IN}" in out
    assert "Traceback" not in out and time.time() - t0 < 60


def test_every_loss_type_trains_tiny_score_from_the_cli_and_logs_its_loss(tmp_path, tiny_ckpt):
    """One multirun over the seven values: 2 SCORE steps each, scripted rollouts (non-zero rewards), two
    mini-batches of one-row micro-batches and two PPO epochs (so dapo and bnpo differ from grpo and the
    ratios move), with the overlong penalty and truncation masking on."""
    sweep = tmp_path / "sweep"
    cli = [sys.executable, "src/train.py", "-m", "experiment=tiny_score", "sft.enabled=false", "rollout=scripted",
           "solver.num_rollouts=2", "data.batch_size=2", "optim.mini_batch_size=1", "optim.ppo_epochs=2",
           "optim.micro_batch_size=1", "solver.max_response_tokens=200", "solver.max_tool_calls=1",
           "evaluator.max_response_tokens=300", "evaluator.max_rubric_tokens=160", "evaluator.max_tool_calls=1",
           "trainer.enable_progress_bar=false", "callbacks.collapse_guard.enabled=false", "trainer.max_steps=2",
           "optim.lr=1e-3", "optim.warmup_steps=0", "reward.overlong.enabled=true", "reward.overlong.buffer_len=150",
           "solver.mask_truncated=true", f"optim.loss_type={','.join(LOSS_TYPES)}", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.run(cli, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    objectives = {}
    for i, loss_type in enumerate(LOSS_TYPES):
        scalars = read_scalars(sweep / str(i))
        assert [s for s, _ in scalars["solver/loss"]] == [0, 1], loss_type
        assert all(math.isfinite(v) for _, v in scalars["solver/loss"] + scalars["solver/objective"]), loss_type
        assert max(v for _, v in scalars["solver/reward_mean"]) > 0, loss_type
        assert all(v < 0 for _, v in scalars["solver/overlong_penalty"]), loss_type  # 200-token cap, 150 buffer
        objectives[loss_type] = scalars["solver/objective"][-1][1]
    assert len(set(objectives.values())) == len(LOSS_TYPES), objectives  # seven different objectives


@pytest.mark.multiprocess  # a trainer and its rollout worker, 35 s: make test-multiprocess (CI)
def test_variants_compose_with_async_rollouts_the_correction_and_the_evaluator_phase(tmp_path, tiny_ckpt):
    """gspo and cispo (the two surrogates of their own) under rollout.mode=async with a token-truncated rollout
    weight: both phases train each step, and the weights and the objective are logged. (The normalisers of the
    others read only token counts, which async does not change.)"""
    sweep = tmp_path / "sweep"
    cli = [sys.executable, "src/train.py", "-m", "experiment=tiny_score", "sft.enabled=false", "rollout=scripted",
           "rollout.mode=async", "optim.rollout_correction=token_truncate", "solver.num_rollouts=2",
           "data.batch_size=2", "optim.mini_batch_size=1", "optim.micro_batch_size=2",
           "solver.max_response_tokens=200", "solver.max_tool_calls=1", "evaluator.max_response_tokens=300",
           "evaluator.max_rubric_tokens=160", "evaluator.max_tool_calls=1", "trainer.enable_progress_bar=false",
           "callbacks.collapse_guard.enabled=false", "trainer.max_steps=2", "optim.lr=1e-3", "optim.warmup_steps=0",
           "optim.loss_type=gspo,cispo", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.run(cli, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for i, loss_type in enumerate(("gspo", "cispo")):
        scalars = read_scalars(sweep / str(i))
        for tag in ("solver/objective", "rollout/is_weight_mean", "evaluator/loss", "rollout/staleness_max"):
            assert [s for s, _ in scalars[tag]] == [0, 1] and all(math.isfinite(v) for _, v in scalars[tag]), \
                (loss_type, tag)
        assert scalars["rollout/staleness_max"][-1][1] == 1.0, loss_type  # step 1 trained a batch of version 0
