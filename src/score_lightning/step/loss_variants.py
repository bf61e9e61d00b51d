"""The solver's GRPO variants (``optim.loss_type``), reward scaling and DAPO's overlong shaping, as pure tensor functions.

Each variant is two choices: the per-token *surrogate* (what each trained token contributes) and the
*normaliser* (what the sum over tokens is divided by). Definitions as the papers, TRL 1.16
(``trl/trainer/grpo_trainer.py`` ``_compute_loss``) and verl (``trainer/ppo/core_algos.py``) give them;
r_t = pi_theta(t) / pi_old(t), A the advantage, eps_l / eps_h = ``optim.clip_ratio_low`` / ``_high``:

========= ================================================ ==============================================
loss_type surrogate per token                               normaliser of the masked sum
========= ================================================ ==============================================
grpo      -min(r_t A, clip(r_t, 1-eps_l, 1+eps_h) A)         the mini-batch's trained tokens (all micro-batches
                                                           and ranks): an exact token mean (verl token-mean)
bnpo      as grpo                                          each micro-batch's own tokens, then the mean over
                                                           micro-batches and ranks (TRL ``bnpo``)
dr_grpo   as grpo                                          the constant (trajectories in the mini-batch) x
                                                           ``solver.max_response_tokens`` (TRL ``dr_grpo``)
dapo      as grpo                                          the trained tokens of the whole step's batch / its
                                                           number of mini-batches (TRL ``dapo``)
gspo      -min(s_t A, clip(s_t, 1-eps_l, 1+eps_h) A) with   per sequence a token mean, then the mean over the
          s_t = sg[s] pi/sg[pi], s = exp(mean_t log r_t)   mini-batch's sequences (GSPO; verl ``gspo``;
                                                           TRL ``importance_sampling_level="sequence"``)
cispo     -sg[clip(r_t, 1-eps_l, 1+eps_h)] A log pi(t)      as grpo (verl ``cispo`` with token-mean)
========= ================================================ ==============================================

The k3 KL to the reference (and an entropy bonus) are added per token before the aggregation, so they
are normalised like the policy term (TRL adds ``beta * per_token_kl`` before aggregating; verl aggregates
them with the actor's mode). An engine-trainer importance weight (``optim.rollout_correction``) multiplies
the policy term only, after clipping, in every variant. ``grpo`` is :func:`~score_lightning.step.losses.grpo_token_loss`
itself, bit for bit.

Every function here returns the micro-batch's *numerator*; :func:`loss_scale` gives the factor the
caller multiplies it by before ``backward``, from counts it sums over the mini-batch (or the step) and
over data-parallel ranks, so the accumulated gradient is the full-batch one wherever the definition is a
batch quantity (verl PR #906, TRL #3021), and a per-micro-batch one where the definition says so (bnpo).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from score_lightning.step.losses import (_broadcast_to_tokens, group_advantages, grpo_token_loss, k3_kl, masked_sum,
                                         policy_ratio)

__all__ = ["LOSS_TYPES", "SCALE_REWARDS", "aggregate", "batch_reward_std", "cispo_surrogate", "default_buffer_len",
           "gspo_surrogate", "loss_scale", "overlong_penalty", "policy_loss", "resolve_scale_rewards",
           "scaled_advantages", "sequence_log_ratio", "sequence_token_means"]

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "gspo", "cispo")
SCALE_REWARDS = ("group", "batch", "none")
_LOG_RATIO_CLAMP = 20.0  # as clipped_surrogate: a stale token (or sequence) cannot produce inf


# --------------------------------------------------------------------------- surrogates


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


def cispo_surrogate(logp: Tensor, old_logp: Tensor, advantages: Tensor, clip_low: float,
                    clip_high: float) -> tuple[Tensor, Tensor, Tensor]:
    """CISPO (MiniMax-M1; verl ``cispo``): ``-sg[clip(r, 1 - clip_low, 1 + clip_high)] * A * log pi(t)``.

    The clipped importance weight is a constant, so every token keeps a gradient (A * w * grad log pi), where
    PPO's clip zeroes it. ``clip_low = 1`` leaves no lower bound (MiniMax-M1 sets eps_low large; TRL 1.16 clamps
    only above, at ``epsilon_high`` = 1 + clip_high). Returns (loss, clipped, ratio): ``clipped`` is 1 where the
    weight differs from the ratio; ``ratio`` = r with its gradient (``loss.kl_is_weighted``).
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


def aggregate(per_token: Tensor, mask: Tensor, loss_type: str) -> Tensor:
    """The micro-batch's numerator: the sum of each row's token mean (``gspo``), else the masked token sum."""
    return sequence_token_means(per_token, mask).sum() if loss_type == "gspo" else masked_sum(per_token, mask)


def policy_loss(logp: Tensor, old_logp: Tensor, ref_logp: Tensor | None, advantages: Tensor, mask: Tensor, *,
                loss_type: str = "grpo", clip_low: float, clip_high: float, kl_coef: float, entropy_coef: float = 0.0,
                entropy: Tensor | None = None, kl_clamp: float = 10.0, is_weight: Tensor | None = None,
                kl_is_weighted: bool = False) -> tuple[Tensor, dict[str, Tensor]]:
    """One micro-batch of ``loss_type``: (numerator, stats) as :func:`~score_lightning.step.losses.grpo_token_loss`.

    grpo, bnpo, dr_grpo and dapo share ``grpo_token_loss`` (a masked token sum; only :func:`loss_scale`
    differs). gspo and cispo swap the surrogate; gspo sums each row's token mean. ``stats`` are masked token
    sums in every case (``pg``, ``kl``, ``clipfrac``, ``entropy``, ``tokens`` and ``loss``, the per-token loss) plus
    ``sequences``, the rows with a trained token. With ``kl_is_weighted`` the KL term is multiplied by the surrogate's own ratio (token r_t,
    or GSPO's s_it, as TRL multiplies it by its ``coef_1``).
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type={loss_type!r}: allowed {', '.join(LOSS_TYPES)}")
    sequences = (mask.bool().sum(dim=-1) > 0).sum().to(torch.float32)
    if loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
        total, stats = grpo_token_loss(logp, old_logp, ref_logp, advantages, mask, clip_low=clip_low,
                                       clip_high=clip_high, kl_coef=kl_coef, entropy_coef=entropy_coef, entropy=entropy,
                                       kl_clamp=kl_clamp, is_weight=is_weight, kl_is_weighted=kl_is_weighted)
        return total, {**stats, "loss": total.detach(), "sequences": sequences}
    if loss_type == "gspo":
        pg, clipped, ratio = gspo_surrogate(logp, old_logp, advantages, mask, clip_low, clip_high)
    else:
        pg, clipped, ratio = cispo_surrogate(logp, old_logp, advantages, clip_low, clip_high)
    if is_weight is not None:
        pg = pg * is_weight.detach().to(pg.dtype)
    per_token = pg
    kl = k3_kl(logp, ref_logp, kl_clamp=kl_clamp) if ref_logp is not None else torch.zeros_like(pg)
    if ref_logp is not None and kl_coef != 0.0:
        per_token = per_token + kl_coef * (kl * ratio if kl_is_weighted else kl)
    if entropy_coef != 0.0:
        if entropy is None:
            raise ValueError("entropy_coef != 0 needs the per-token entropy tensor")
        per_token = per_token - entropy_coef * entropy
    with torch.no_grad():
        stats = {"pg": masked_sum(pg.detach(), mask), "kl": masked_sum(kl.detach(), mask),
                 "clipfrac": masked_sum(clipped, mask), "tokens": mask.bool().sum().to(pg.dtype),
                 "entropy": masked_sum(entropy.detach().to(pg.dtype), mask) if entropy is not None else pg.new_zeros(()),
                 "loss": masked_sum(per_token.detach(), mask), "sequences": sequences}
    return aggregate(per_token, mask, loss_type), stats


# --------------------------------------------------------------------------- normalisers


def loss_scale(loss_type: str, *, world: int, mini_tokens: float, step_tokens: float = 0.0, mini_batches: int = 1,
               mini_sequences: float = 0.0, mini_trajectories: float = 0.0, max_len: int = 0,
               micro_tokens: float = 0.0, micro_batches: int = 1) -> float:
    """The factor on a micro-batch's numerator before ``backward``; counts are global (summed over ranks) unless
    named ``micro_*`` (this rank's micro-batch).

    Data-parallel gradients are *averaged* over the ``world`` ranks, so a batch quantity carries ``world``:
    grpo / cispo ``world / mini_tokens``; dapo ``world * mini_batches / step_tokens``; dr_grpo
    ``world / (mini_trajectories * max_len)``; gspo ``world / mini_sequences``. bnpo is a mean of local means:
    ``1 / (micro_tokens * micro_batches)`` (its micro-batch's own tokens, at least 1, and this rank's number of
    micro-batches in the mini-batch), which the ranks' average then averages.
    """
    if loss_type in ("grpo", "cispo"):
        return world / mini_tokens
    if loss_type == "dapo":
        return world * mini_batches / step_tokens
    if loss_type == "dr_grpo":
        return world / (mini_trajectories * max_len)
    if loss_type == "gspo":
        return world / mini_sequences
    if loss_type == "bnpo":
        return 1.0 / (max(micro_tokens, 1.0) * micro_batches)
    raise ValueError(f"loss_type={loss_type!r}: allowed {', '.join(LOSS_TYPES)}")


# --------------------------------------------------------------------------- rewards


def resolve_scale_rewards(scale: str | None, norm_adv_by_std: bool | None) -> str:
    """``optim.scale_rewards`` with the older ``loss.norm_adv_by_std`` (null: unset): false means ``none``
    (Dr. GRPO) and true means ``group``; a contradiction between the two raises."""
    scale = "group" if scale is None else str(scale)
    if scale not in SCALE_REWARDS:
        raise ValueError(f"optim.scale_rewards={scale!r}: allowed {', '.join(SCALE_REWARDS)}")
    if norm_adv_by_std is None or (norm_adv_by_std and scale != "none"):
        return scale
    if not norm_adv_by_std and scale in ("group", "none"):
        return "none"
    raise ValueError(f"loss.norm_adv_by_std={str(norm_adv_by_std).lower()} contradicts optim.scale_rewards={scale}; "
                     "drop loss.norm_adv_by_std (deprecated) and set optim.scale_rewards alone")


def batch_reward_std(rewards: Tensor, include: Tensor | None = None) -> float:
    """The unbiased standard deviation of the (included) rewards of the whole batch; 0 with fewer than two."""
    r = rewards.detach().double()
    if include is not None:
        r = r[include.to(torch.bool)]
    return float(r.std(unbiased=True)) if r.numel() > 1 else 0.0


def scaled_advantages(rewards: Tensor, group_size: int, scale: str = "group", eps: float = 1e-6,
                      include: Tensor | None = None, batch_std: float | None = None) -> Tensor:
    """GRPO advantages ``r - mean_group`` divided by the scale of ``optim.scale_rewards``.

    ``group``: the group's unbiased std (:func:`~score_lightning.step.losses.group_advantages`, bit for bit);
    ``none``: not divided (Dr. GRPO); ``batch``: the std of every (included) reward of the batch, ``batch_std``
    (the global batch's under data parallelism; default: of ``rewards``), as TRL's ``scale_rewards="batch"``
    (Lite PPO: group mean, batch std). A group with equal rewards has advantage exactly 0 under all three.
    """
    if scale not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards={scale!r}: allowed {', '.join(SCALE_REWARDS)}")
    if scale != "batch":
        return group_advantages(rewards, group_size, normalize_std=scale == "group", eps=eps, include=include)
    centred = group_advantages(rewards, group_size, normalize_std=False, eps=eps, include=include)
    std = batch_reward_std(rewards, include) if batch_std is None else float(batch_std)
    return centred / (std + eps)


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
