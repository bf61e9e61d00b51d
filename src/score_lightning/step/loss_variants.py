"""The solver's GRPO variants (``optim.loss_type``), reward scaling and DAPO's overlong shaping, as pure tensor functions.

Each variant is two choices: the per-token *surrogate* (what each trained token contributes) and the
*normaliser* (what the sum over tokens is divided by); :mod:`~score_lightning.step.loss_registry` registers each
pair under its name and holds the normalisers. Definitions as the papers, TRL 1.16
(``trl/trainer/grpo_trainer.py`` ``_compute_loss``) and verl (``trainer/ppo/core_algos.py``) give them;
r_t = pi_theta(t) / pi_old(t), A the advantage, eps_l / eps_h = ``optim.clip_ratio_low`` / ``_high``:

============= ============================================== ==============================================
loss_type     surrogate per token                             normaliser of the masked sum
============= ============================================== ==============================================
grpo          -min(r_t A, clip(r_t, 1-eps_l, 1+eps_h) A)       the mini-batch's trained tokens (all micro-batches
                                                             and ranks): an exact token mean (verl token-mean)
grpo_seq_mean as grpo                                        per sequence a token mean, then the mean over the
                                                             mini-batch's sequences (TRL ``grpo``, the paper's)
bnpo          as grpo                                        each micro-batch's own tokens, then the mean over
                                                             micro-batches and ranks (TRL ``bnpo``)
dr_grpo       as grpo                                        the constant (trajectories in the mini-batch) x
                                                             ``solver.max_response_tokens`` (TRL ``dr_grpo``)
dapo          as grpo                                        the trained tokens of the whole step's batch / its
                                                             number of mini-batches (TRL ``dapo``)
gspo          -min(s_t A, clip(s_t, 1-eps_l, 1+eps_h) A) with as grpo_seq_mean (GSPO; verl ``gspo``;
              s_t = sg[s] pi/sg[pi], s = exp(mean_t log r_t) TRL ``importance_sampling_level="sequence"``)
cispo         -sg[clip(r_t, 1-eps_l, 1+eps_h)] A log pi(t)    as grpo (verl ``cispo`` with token-mean)
============= ============================================== ==============================================

The k3 KL to the reference (and an entropy bonus) are added per token before the aggregation, so they
are normalised like the policy term (TRL adds ``beta * per_token_kl`` before aggregating; verl aggregates
them with the actor's mode). An engine-trainer importance weight (``optim.rollout_correction``) multiplies
the policy term only, after clipping, in every variant. ``grpo`` is :func:`~score_lightning.step.losses.grpo_token_loss`
itself, bit for bit.

A surrogate has one signature, ``(logp, old_logp, advantages, mask, clip_low, clip_high) -> (loss, clipped,
ratio)``; the loss returns each micro-batch's *numerator*, and the normaliser's factor comes from counts summed
over the mini-batch (or the step) and over data-parallel ranks, so the accumulated gradient is the full-batch one
wherever the definition is a batch quantity (verl PR #906, TRL #3021), and a per-micro-batch one where the
definition says so (bnpo).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from score_lightning.step.losses import _broadcast_to_tokens, clipped_surrogate, policy_ratio

__all__ = ["batch_reward_std", "cispo_surrogate", "default_buffer_len", "gspo_surrogate", "overlong_penalty",
           "ppo_clip_surrogate", "sequence_log_ratio", "sequence_token_means"]

_LOG_RATIO_CLAMP = 20.0  # as clipped_surrogate: a stale token (or sequence) cannot produce inf


# --------------------------------------------------------------------------- surrogates


def ppo_clip_surrogate(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, clip_low: float,
                       clip_high: float) -> tuple[Tensor, Tensor, None]:
    """PPO's clipped surrogate per token (:func:`~score_lightning.step.losses.clipped_surrogate`): the grpo family's.

    Token-level, so ``mask`` is not read. Its ratio is r_t: ``None`` lets the loss build it only when
    ``loss.kl_is_weighted`` asks, as ``grpo_token_loss`` does (bit for bit)."""
    loss, clipped = clipped_surrogate(logp, old_logp, advantages, clip_low=clip_low, clip_high=clip_high)
    return loss, clipped, None


def sequence_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """``[B, 1]``: each row's mean of ``log pi - log pi_old`` over its mask-1 tokens (0 for a row without any),
    clamped to +-20: log s_i of GSPO, the length-normalised sequence likelihood ratio."""
    keep = mask.bool()
    diff = torch.where(keep, logp - old_logp, torch.zeros((), dtype=logp.dtype, device=logp.device))
    n = keep.sum(dim=-1, keepdim=True).clamp(min=1).to(logp.dtype)
    return (diff.sum(dim=-1, keepdim=True) / n).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)


def gspo_surrogate(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, clip_low: float,
                   clip_high: float) -> tuple[Tensor, Tensor, Tensor]:
    """GSPO's clipped surrogate per token, in the GSPO-token form (paper section 4.3; verl ``gspo``).

    s_i = exp(mean_t log r_t) over row i's trained tokens, and per token s_it = sg[s_i] * pi(t) / sg[pi(t)]:
    its value is s_i, its gradient s_i * grad log pi(t). With one advantage per sequence, the sequence mean
    of ``-min(s_it A, clip(s_it) A)`` has the value and gradient of the sequence-level objective
    ``-min(s_i A, clip(s_i) A)`` (TRL's ``importance_sampling_level="sequence"``); a ``[B, T]`` advantage
    (step rewards) is allowed, as GSPO-token allows it. Returns (loss, clipped, ratio) ``[B, T]``: ``clipped``
    is 1 where the clipped branch was strictly chosen, ``ratio`` = s_it (what ``loss.kl_is_weighted`` uses).
    """
    a = _broadcast_to_tokens(advantages, logp).detach()
    log_s = sequence_log_ratio(logp, old_logp.detach(), mask).detach()
    ratio = torch.exp(log_s + logp - logp.detach())
    loss_unclipped = -a * ratio
    loss_clipped = -a * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    return loss, (loss_clipped > loss_unclipped).to(logp.dtype), ratio


def cispo_surrogate(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, clip_low: float,
                    clip_high: float) -> tuple[Tensor, Tensor, Tensor]:
    """CISPO (MiniMax-M1; verl ``cispo``): ``-sg[clip(r, 1 - clip_low, 1 + clip_high)] * A * log pi(t)``.

    The clipped importance weight is a constant, so every token keeps a gradient (A * w * grad log pi), where
    PPO's clip zeroes it. ``clip_low = 1`` leaves no lower bound (MiniMax-M1 sets eps_low large; TRL 1.16 clamps
    only above, at ``epsilon_high`` = 1 + clip_high). Token-level: ``mask`` is not read. Returns (loss, clipped,
    ratio): ``clipped`` is 1 where the weight differs from the ratio; ``ratio`` = r with its gradient
    (``loss.kl_is_weighted``).
    """
    a = _broadcast_to_tokens(advantages, logp).detach()
    ratio = policy_ratio(logp, old_logp, _LOG_RATIO_CLAMP)
    raw = ratio.detach()
    weight = raw.clamp(1.0 - clip_low, 1.0 + clip_high)
    return -weight * a * logp, (weight != raw).to(logp.dtype), ratio


def sequence_token_means(x: Tensor, mask: Tensor) -> Tensor:
    """``[B]``: each row's mean of ``x`` over its mask-1 tokens (0 for a row without any)."""
    keep = mask.bool()
    total = torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum(dim=-1)
    return total / keep.sum(dim=-1).clamp(min=1).to(x.dtype)


# --------------------------------------------------------------------------- rewards


def batch_reward_std(rewards: Tensor, include: Tensor | None = None) -> float:
    """The unbiased standard deviation of the (included) rewards of the whole batch; 0 with fewer than two."""
    r = rewards.detach().double()
    if include is not None:
        r = r[include.to(torch.bool)]
    return float(r.std(unbiased=True)) if r.numel() > 1 else 0.0


def overlong_penalty(lengths: Tensor, max_len: int, buffer_len: int, factor: float = 1.0) -> Tensor:
    """DAPO's soft overlong punishment (its eq. 13; verl's ``overlong_buffer``; TRL's ``get_soft_overlong_punishment``).

    0 up to ``max_len - buffer_len`` tokens, then falling linearly to ``-factor`` at ``max_len``, and ``-factor``
    beyond: ``-factor * min(max(len - (max_len - buffer_len), 0) / buffer_len, 1)``. Added to the reward.
    """
    if not 0 < buffer_len <= max_len:
        raise ValueError(f"buffer_len={buffer_len} must be in (0, max_len={max_len}]")
    excess = (lengths.to(torch.float64) - (max_len - buffer_len)).clamp(min=0.0) / buffer_len
    return (-float(factor) * excess.clamp(max=1.0)).to(torch.float32)


def default_buffer_len(max_len: int) -> int:
    """``reward.overlong.buffer_len: null``: a fifth of the cap (DAPO: 4,096 of 20,480), at least 1."""
    return max(1, math.floor(max_len / 5))
