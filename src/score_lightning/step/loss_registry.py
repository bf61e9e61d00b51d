"""``optim.loss_type`` and ``optim.scale_rewards`` as registries of pure functions, and the lookups the step calls.

Why: every GRPO-family loss is two independent choices, a per-token *surrogate* and a *normaliser* (what the
masked sum of the per-token loss is divided by): ``grpo`` and ``grpo_seq_mean`` share the surrogate, ``gspo`` and
``grpo_seq_mean`` the normaliser. A :class:`PolicyLoss` names the pair; adding a variant is one
``POLICY_LOSSES.register(name, PolicyLoss(surrogate, normaliser))`` and its test, with no branch on a name
anywhere (verl's ``register_policy_loss``). A normaliser is exact under gradient accumulation and data
parallelism by construction: a micro-batch contributes its ``numerator``, and ``scale`` turns counts summed over
the mini-batch (or the step) and over ranks into the factor it is multiplied by before ``backward`` (verl PR
#906, TRL #3021). The reward scalings of ``optim.scale_rewards`` are registered pure functions likewise.
The surrogates themselves are in :mod:`~score_lightning.step.loss_variants`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch
from torch import Tensor

from score_lightning.registry import Registry
from score_lightning.step.losses import group_advantages, k3_kl, masked_sum, policy_ratio
from score_lightning.step.loss_variants import (batch_reward_std, cispo_surrogate, gspo_surrogate, ppo_clip_surrogate,
                                                sequence_token_means)

__all__ = ["Counts", "NORMALISERS", "Normaliser", "POLICY_LOSSES", "PolicyLoss", "REWARD_SCALINGS", "RewardScaling",
           "Surrogate", "aggregate", "loss_scale", "normaliser", "policy_loss", "scaled_advantages"]

#: the counts ``solver_update`` sums over ranks only for a normaliser that names them in ``Normaliser.gathers``
GATHERED = frozenset({"step_tokens", "mini_trajectories", "mini_sequences"})


class Surrogate(Protocol):
    """The per-token policy term: ``(loss, clipped, ratio)``, each ``[B, T]``. ``clipped`` is the clipfrac
    numerator; ``ratio`` is what ``loss.kl_is_weighted`` multiplies the KL by, or ``None`` for the token ratio
    r_t, which :func:`policy_loss` builds only when asked (so ``grpo`` stays ``grpo_token_loss`` bit for bit)."""

    def __call__(self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, clip_low: float,
                 clip_high: float) -> tuple[Tensor, Tensor, Tensor | None]: ...


@dataclass(frozen=True)
class Counts:
    """What a normaliser may divide by: global (summed over the micro-batches and over ranks) unless ``micro_*``."""

    world: int  # data-parallel ranks: their gradients are averaged, so a global count carries the world size
    mini_tokens: float  # trained tokens of the mini-batch
    step_tokens: float = 0.0  # trained tokens of the step's whole batch (gathered on request)
    mini_batches: int = 1  # mini-batches (optimiser steps) per epoch of the step
    mini_sequences: float = 0.0  # rows of the mini-batch with a trained token (gathered on request)
    mini_trajectories: float = 0.0  # trajectories of the mini-batch, masked ones too (gathered on request)
    max_len: int = 0  # a trajectory's most response tokens (GRPOSettings.max_response_tokens)
    micro_tokens: float = 0.0  # this rank's micro-batch's trained tokens
    micro_batches: int = 1  # this rank's micro-batches in the mini-batch


@dataclass(frozen=True)
class Normaliser:
    """The division of a loss: ``numerator(per_token, mask)`` is a micro-batch's share of the sum, ``scale(counts)``
    the factor on it before ``backward``; ``gathers`` the counts of :data:`GATHERED` it reads (a collective each)."""

    numerator: Callable[[Tensor, Tensor], Tensor]
    scale: Callable[[Counts], float]
    gathers: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not self.gathers <= GATHERED:
            raise ValueError(f"gathers {sorted(self.gathers - GATHERED)}: only {sorted(GATHERED)} are gathered")

    @property
    def counts_sequences(self) -> bool:
        """Whether a row is the unit (a token mean per row): a MaMs trajectory's rows are role calls."""
        return "mini_sequences" in self.gathers


@dataclass(frozen=True)
class PolicyLoss:
    """One ``optim.loss_type``: what each trained token contributes, and what their sum is divided by."""

    surrogate: Surrogate
    normaliser: Normaliser


class RewardScaling(Protocol):
    """``optim.scale_rewards``: group-relative advantages from group-contiguous rewards ``[B*K]``. ``batch_std``
    gives the (global) batch's reward std; only a scaling that reads it calls it (a collective under DDP)."""

    def __call__(self, rewards: Tensor, group_size: int, *, eps: float, include: Tensor | None,
                 batch_std: Callable[[], float]) -> Tensor: ...


NORMALISERS: Registry[Normaliser] = Registry("normaliser")
POLICY_LOSSES: Registry[PolicyLoss] = Registry("optim.loss_type")
REWARD_SCALINGS: Registry[RewardScaling] = Registry("optim.scale_rewards")

# --------------------------------------------------------------------------- normalisers (exact expressions: golden)

NORMALISERS.register("token_mean", Normaliser(masked_sum, lambda c: c.world / c.mini_tokens))
NORMALISERS.register("micro_token_mean", Normaliser(masked_sum,
                                                    lambda c: 1.0 / (max(c.micro_tokens, 1.0) * c.micro_batches)))
NORMALISERS.register("constant", Normaliser(masked_sum, lambda c: c.world / (c.mini_trajectories * c.max_len),
                                            frozenset({"mini_trajectories"})))
NORMALISERS.register("step_token_mean", Normaliser(masked_sum, lambda c: c.world * c.mini_batches / c.step_tokens,
                                                   frozenset({"step_tokens"})))
NORMALISERS.register("sequence_mean", Normaliser(lambda x, m: sequence_token_means(x, m).sum(),
                                                 lambda c: c.world / c.mini_sequences, frozenset({"mini_sequences"})))

# --------------------------------------------------------------------------- the losses (table: step/loss_variants.py)

POLICY_LOSSES.register("grpo", PolicyLoss(ppo_clip_surrogate, NORMALISERS.get("token_mean")))
POLICY_LOSSES.register("grpo_seq_mean", PolicyLoss(ppo_clip_surrogate, NORMALISERS.get("sequence_mean")))
POLICY_LOSSES.register("bnpo", PolicyLoss(ppo_clip_surrogate, NORMALISERS.get("micro_token_mean")))
POLICY_LOSSES.register("dr_grpo", PolicyLoss(ppo_clip_surrogate, NORMALISERS.get("constant")))
POLICY_LOSSES.register("dapo", PolicyLoss(ppo_clip_surrogate, NORMALISERS.get("step_token_mean")))
POLICY_LOSSES.register("gspo", PolicyLoss(gspo_surrogate, NORMALISERS.get("sequence_mean")))
POLICY_LOSSES.register("cispo", PolicyLoss(cispo_surrogate, NORMALISERS.get("token_mean")))


def policy_loss(logp: Tensor, old_logp: Tensor, ref_logp: Tensor | None, advantages: Tensor, mask: Tensor, *,
                loss_type: str = "grpo", clip_low: float, clip_high: float, kl_coef: float, entropy_coef: float = 0.0,
                entropy: Tensor | None = None, kl_clamp: float = 10.0, is_weight: Tensor | None = None,
                kl_is_weighted: bool = False) -> tuple[Tensor, dict[str, Tensor]]:
    """One micro-batch of ``loss_type``: (numerator, stats) as :func:`~score_lightning.step.losses.grpo_token_loss`.

    Per token: w_t * surrogate + kl_coef * KL_t - entropy_coef * H_t, then the normaliser's numerator (multiply it
    by :func:`loss_scale`). ``stats`` are masked token sums in every case (``pg``, ``kl``, ``clipfrac``, ``entropy``,
    ``tokens`` and ``loss``, the per-token loss) plus ``sequences``, the rows with a trained token. With
    ``kl_is_weighted`` the KL term is multiplied by the surrogate's own ratio (token r_t, or GSPO's s_it, as TRL
    multiplies it by its ``coef_1``).
    """
    loss = POLICY_LOSSES.get(loss_type)
    sequences = (mask.bool().sum(dim=-1) > 0).sum().to(torch.float32)
    pg, clipped, ratio = loss.surrogate(logp, old_logp, advantages, mask, clip_low, clip_high)
    if is_weight is not None:
        pg = pg * is_weight.detach().to(pg.dtype)
    per_token = pg
    kl = k3_kl(logp, ref_logp, kl_clamp=kl_clamp) if ref_logp is not None else torch.zeros_like(pg)
    if ref_logp is not None and kl_coef != 0.0:
        if kl_is_weighted:
            per_token = per_token + kl_coef * (kl * (policy_ratio(logp, old_logp) if ratio is None else ratio))
        else:
            per_token = per_token + kl_coef * kl
    if entropy_coef != 0.0:
        if entropy is None:
            raise ValueError("entropy_coef != 0 needs the per-token entropy tensor")
        per_token = per_token - entropy_coef * entropy
    with torch.no_grad():
        stats = {"pg": masked_sum(pg.detach(), mask), "kl": masked_sum(kl.detach(), mask),
                 "clipfrac": masked_sum(clipped, mask),
                 "entropy": masked_sum(entropy.detach().to(pg.dtype), mask) if entropy is not None else pg.new_zeros(()),
                 "tokens": mask.bool().sum().to(pg.dtype), "loss": masked_sum(per_token.detach(), mask),
                 "sequences": sequences}
    return loss.normaliser.numerator(per_token, mask), stats


def normaliser(loss_type: str) -> Normaliser:
    """``loss_type``'s normaliser (which counts the update gathers for it)."""
    return POLICY_LOSSES.get(loss_type).normaliser


def aggregate(per_token: Tensor, mask: Tensor, loss_type: str) -> Tensor:
    """The micro-batch's numerator of ``loss_type``: its normaliser's (a masked token sum, or a sum of row means)."""
    return normaliser(loss_type).numerator(per_token, mask)


def loss_scale(loss_type: str, **counts) -> float:
    """The factor on a micro-batch's numerator before ``backward``, from :class:`Counts` given by keyword.

    Built in: grpo / cispo ``world / mini_tokens``; dapo ``world * mini_batches / step_tokens``; dr_grpo
    ``world / (mini_trajectories * max_len)``; gspo / grpo_seq_mean ``world / mini_sequences``; bnpo, a mean of
    local means, ``1 / (max(micro_tokens, 1) * micro_batches)``, which the ranks' average then averages.
    """
    return normaliser(loss_type).scale(Counts(**counts))


# --------------------------------------------------------------------------- reward scalings


@REWARD_SCALINGS.register("group")
def group_scaled(rewards: Tensor, group_size: int, *, eps: float, include: Tensor | None,
                 batch_std: Callable[[], float]) -> Tensor:
    """GRPO: each group's unbiased std (:func:`~score_lightning.step.losses.group_advantages`, bit for bit)."""
    return group_advantages(rewards, group_size, normalize_std=True, eps=eps, include=include)


@REWARD_SCALINGS.register("none")
def group_centred(rewards: Tensor, group_size: int, *, eps: float, include: Tensor | None,
                  batch_std: Callable[[], float]) -> Tensor:
    """Dr. GRPO: ``r - mean_group``, not divided."""
    return group_advantages(rewards, group_size, normalize_std=False, eps=eps, include=include)


@REWARD_SCALINGS.register("batch")
def batch_scaled(rewards: Tensor, group_size: int, *, eps: float, include: Tensor | None,
                 batch_std: Callable[[], float]) -> Tensor:
    """Lite PPO / TRL's ``scale_rewards="batch"``: the group mean, the std of every (included) reward of the batch."""
    centred = group_advantages(rewards, group_size, normalize_std=False, eps=eps, include=include)
    return centred / (batch_std() + eps)


def scaled_advantages(rewards: Tensor, group_size: int, scale: str = "group", eps: float = 1e-6,
                      include: Tensor | None = None, batch_std: float | Callable[[], float] | None = None) -> Tensor:
    """GRPO advantages ``r - mean_group`` divided by the scale of ``optim.scale_rewards`` (a registry lookup).

    ``batch_std``: the batch's reward std (the global batch's under data parallelism), or a function giving it
    when a scaling asks (default: of ``rewards``). A group with equal rewards has advantage exactly 0 under all three.
    """
    def std() -> float:
        if batch_std is None:
            return batch_reward_std(rewards, include)
        return float(batch_std() if callable(batch_std) else batch_std)

    return REWARD_SCALINGS.get(scale)(rewards, group_size, eps=eps, include=include, batch_std=std)

