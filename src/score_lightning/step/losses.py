"""SCORE losses as pure tensor functions: GRPO for the solver, REINFORCE for the evaluator.

Shapes: ``B`` sequences, ``T`` tokens, ``V`` vocabulary. ``mask`` is a float or bool ``[B, T]``
tensor that is 1 on tokens the policy generated (the response) and 0 on prompt, tool
observation and padding tokens. Only mask-1 tokens contribute loss or gradient.

Aggregation (why the GRPO loss returns a *sum*)
------------------------------------------------
The solver objective is the token mean over every response token of a PPO mini-batch. With
gradient accumulation over micro-batches of uneven response lengths, averaging per-micro-batch
token means (``mean_m(sum_m / n_m)``) weights tokens of short micro-batches more than tokens of
long ones, so the accumulated gradient is *not* the full-batch gradient (verl PR #906,
TRL #3021). :func:`grpo_token_loss` therefore returns the masked *sum* over the micro-batch; the
caller divides every micro-batch by the same global token count of the whole mini-batch
(``sum of mask over all its micro-batches``, all-reduced across data-parallel ranks when
sharded). Then ``sum_m sum_m(loss) / N_global`` is exactly the full-batch token mean, and so is
its gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "token_logprobs",
    "entropy_from_logits",
    "group_advantages",
    "k3_kl",
    "clipped_surrogate",
    "policy_ratio",
    "masked_sum",
    "masked_mean",
    "grpo_token_loss",
    "reinforce_loss",
]

#: Rows of ``[*, T, V]`` logits upcast to float32 at once in :func:`token_logprobs` and
#: :func:`entropy_from_logits`. A float32 copy of all of ``[B, T, V]`` (e.g. 4 x 8192 x 152k) is
#: ~20 GB; one row at a time bounds the extra memory to ``T x V`` floats.
_CHUNK_ROWS = 1


def _row_chunks(t: Tensor, chunk_rows: int) -> tuple[Tensor, ...]:
    """Row chunks as ``Tensor.split`` views: one backward node for all of them, where slicing in a
    loop makes one full-size zero gradient per slice (5x slower backward on [16, 469, 4100] logits)."""
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    return t.split(chunk_rows, dim=0)


def token_logprobs(
    logits: Tensor, labels: Tensor, temperature: float = 1.0, chunk_rows: int = _CHUNK_ROWS
) -> Tensor:
    """Log-probability of each label under ``softmax(logits / temperature)``.

    ``logits [B, T, V]`` must already be aligned to ``labels [B, T]`` (i.e. shifted by the caller:
    ``logits[:, t]`` predicts ``labels[:, t]``). Returns float32 ``[B, T]``.

    The temperature must be the sampling temperature: the trainer's log-probs have to describe
    the distribution the rollout engine actually sampled from, or the importance ratio is biased.
    We compute ``logit[label] - logsumexp(logits)`` instead of materialising ``log_softmax``, and
    upcast to float32 one chunk of rows at a time (bf16 log-probs are too coarse for ratios), so
    peak extra memory is one ``[chunk_rows, T, V]`` float32 block. Negative labels (e.g. the
    ``-100`` ignore index on padding) are read as token 0; their values are meaningless and must
    be masked out by the caller.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not align with labels {tuple(labels.shape)}")
    safe_labels = labels.clamp(min=0).unsqueeze(-1)
    out = []
    for chunk, chunk_labels in zip(_row_chunks(logits, chunk_rows), _row_chunks(safe_labels, chunk_rows)):
        lg = chunk.float()
        if temperature != 1.0:
            lg = lg / temperature
        picked = lg.gather(-1, chunk_labels).squeeze(-1)
        out.append(picked - torch.logsumexp(lg, dim=-1))
    if not out:  # B == 0
        return logits.new_zeros(labels.shape, dtype=torch.float32)
    return torch.cat(out, dim=0)


def entropy_from_logits(logits: Tensor, chunk_rows: int = _CHUNK_ROWS) -> Tensor:
    """Entropy ``H = logsumexp(z) - sum softmax(z) * z`` per position: ``[B, T, V] -> [B, T]``.

    This form needs no ``log_softmax`` tensor and is exact for any logit shift. It is the
    quantity the collapse guard watches (``solver/entropy``). Float32, chunked like
    :func:`token_logprobs`. Pass logits already divided by the sampling temperature if the
    entropy of the sampling distribution is wanted.
    """
    out = []
    for chunk in _row_chunks(logits, chunk_rows):
        lg = chunk.float()
        # shift by the max first: both terms are then O(log V), no cancellation of large logits
        lg = lg - lg.amax(dim=-1, keepdim=True).detach()
        probs = torch.softmax(lg, dim=-1)
        out.append(torch.logsumexp(lg, dim=-1) - (probs * lg).sum(dim=-1))
    if not out:
        return logits.new_zeros(logits.shape[:-1], dtype=torch.float32)
    return torch.cat(out, dim=0)


def group_advantages(
    rewards: Tensor, group_size: int, normalize_std: bool = True, eps: float = 1e-6, include: Tensor | None = None
) -> Tensor:
    """GRPO advantages ``(r - mean_group) / (std_group + eps)`` for group-contiguous rewards.

    ``rewards [B*K]`` holds query ``i``'s K rollouts at rows ``i*K .. i*K+K-1``. Returns ``[B*K]``.

    Std convention: **unbiased** (Bessel, divide by ``K - 1``), i.e. ``torch.std`` defaults, as in
    verl's ``compute_grpo_outcome_advantage`` and TRL's ``GRPOTrainer``, so advantages follow
    the same convention as those implementations. (For K = 8 the unbiased std is
    ``sqrt(8/7)`` ~ 1.069x the population std, i.e. advantages are ~6.5% smaller.)
    ``normalize_std=False`` gives Dr. GRPO's ``r - mean`` (no per-question difficulty
    re-weighting).

    A group whose rewards are all equal carries no learning signal: its advantages are set to
    exactly 0 (not ``tiny / eps``, which float rounding of the mean could otherwise produce).

    ``include`` ([B*K] bool, ``evaluator.on_incomplete=drop``): only these rollouts form their group's
    mean and std; the others get advantage 0. A group with fewer than two included rollouts has none.
    """
    if group_size < 2:
        raise ValueError(f"group_size must be >= 2 for group-relative advantages, got {group_size}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B*K], got shape {tuple(rewards.shape)}")
    if rewards.numel() % group_size != 0:
        raise ValueError(f"{rewards.numel()} rewards are not a multiple of group_size={group_size}")
    r = rewards.detach()
    if not r.is_floating_point():
        r = r.float()
    grouped = r.view(-1, group_size)
    if include is not None:
        return _masked_group_advantages(grouped, include.to(grouped.device).view(-1, group_size), normalize_std, eps)
    mean = grouped.mean(dim=1, keepdim=True)
    adv = grouped - mean
    if normalize_std:
        std = grouped.std(dim=1, unbiased=True, keepdim=True)
        adv = adv / (std + eps)
    constant = grouped.amax(dim=1, keepdim=True) == grouped.amin(dim=1, keepdim=True)
    adv = torch.where(constant, torch.zeros_like(adv), adv)
    return adv.reshape(-1)


def _masked_group_advantages(grouped: Tensor, include: Tensor, normalize_std: bool, eps: float) -> Tensor:
    """:func:`group_advantages` over the included rollouts of each group (same conventions)."""
    inc = include.to(grouped.dtype)
    n = inc.sum(dim=1, keepdim=True)
    mean = (grouped * inc).sum(dim=1, keepdim=True) / n.clamp(min=1.0)
    adv = (grouped - mean) * inc
    if normalize_std:
        std = ((adv ** 2).sum(dim=1, keepdim=True) / (n - 1.0).clamp(min=1.0)).sqrt()
        adv = adv / (std + eps)
    big, small = torch.finfo(grouped.dtype).max, torch.finfo(grouped.dtype).min
    hi = torch.where(include, grouped, torch.full_like(grouped, small)).amax(dim=1, keepdim=True)
    lo = torch.where(include, grouped, torch.full_like(grouped, big)).amin(dim=1, keepdim=True)
    silent = (n < 2) | (hi == lo)
    return torch.where(silent | ~include, torch.zeros_like(adv), adv).reshape(-1)


def k3_kl(logp: Tensor, ref_logp: Tensor, log_ratio_clamp: float = 20.0, kl_clamp: float = 10.0) -> Tensor:
    """Per-token k3 estimator of ``KL(pi || ref)`` (Schulman, "Approximating KL divergence").

    With ``r = ref_logp - logp`` (clamped to ``+-log_ratio_clamp``), ``kl = exp(r) - r - 1``,
    clamped to ``[-kl_clamp, kl_clamp]``: verl's ``low_var_kl``. For tokens sampled from pi it is
    unbiased, always >= 0, and much lower variance than ``-r``; its gradient w.r.t. ``logp`` is
    ``1 - exp(r)``, which pulls pi toward ref. The clamps stop one wildly off-reference token
    (``exp(20+)``) from dominating the batch.
    """
    r = (ref_logp - logp).clamp(min=-log_ratio_clamp, max=log_ratio_clamp)
    kl = torch.exp(r) - r - 1.0
    return kl.clamp(min=-kl_clamp, max=kl_clamp)


def _broadcast_to_tokens(advantages: Tensor | float, like: Tensor) -> Tensor:
    a = torch.as_tensor(advantages, dtype=like.dtype, device=like.device)
    if a.dim() == like.dim() - 1 and a.dim() > 0:
        a = a.unsqueeze(-1)
    return a


def clipped_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    log_ratio_clamp: float = 20.0,
) -> tuple[Tensor, Tensor]:
    """PPO clipped policy-gradient loss per token and the clip indicator.

    ``loss = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)`` with
    ``ratio = exp(logp - old_logp)``. ``advantages`` is ``[B]`` (one per sequence, broadcast
    over tokens) or ``[B, T]``; it is treated as a constant (detached). ``clip_low != clip_high``
    gives DAPO's asymmetric "clip-higher". The log-ratio is clamped to ``+-log_ratio_clamp``
    before ``exp`` (as verl does) so a stale token cannot produce ``inf``.

    The second output is float 1 where the clipped branch was strictly chosen, i.e. the
    token's gradient is zeroed by clipping (A > 0 and ratio > 1 + clip_high, or A < 0 and
    ratio < 1 - clip_low); it is the ``clipfrac`` numerator.
    """
    a = _broadcast_to_tokens(advantages, logp).detach()
    log_ratio = (logp - old_logp).clamp(min=-log_ratio_clamp, max=log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -a * ratio
    loss_clipped = -a * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    clipped = (loss_clipped > loss_unclipped).to(logp.dtype)
    return loss, clipped


def policy_ratio(logp: Tensor, old_logp: Tensor, log_ratio_clamp: float = 20.0) -> Tensor:
    """``pi_theta / pi_old = exp(logp - old_logp)`` per token, with its gradient; clamped as in
    :func:`clipped_surrogate` so a stale token cannot produce ``inf``."""
    return torch.exp((logp - old_logp.detach()).clamp(min=-log_ratio_clamp, max=log_ratio_clamp))


def masked_sum(x: Tensor, mask: Tensor) -> Tensor:
    """Sum of ``x`` over mask-1 entries (scalar).

    Uses ``where`` rather than ``x * mask`` so non-finite values at masked positions (e.g. a
    ``-inf`` log-prob on padding) cannot turn the sum into NaN, and their gradient is exactly 0.
    """
    keep = mask.bool() if mask.dtype != torch.bool else mask
    return torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum()


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over mask-1 entries; exactly 0 (not NaN) when the mask is empty."""
    return masked_sum(x, mask) / mask.bool().sum().clamp(min=1)


def grpo_token_loss(
    logp: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    kl_coef: float,
    entropy_coef: float = 0.0,
    entropy: Tensor | None = None,
    kl_clamp: float = 10.0,
    is_weight: Tensor | None = None,
    kl_is_weighted: bool = False,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Solver GRPO actor loss for one micro-batch, as a **sum** over response tokens.

    Per token: ``pg + kl_coef * k3_kl(logp, ref_logp) - entropy_coef * entropy``. The KL to the
    frozen reference sits in the actor loss (SCORE / verl ``use_kl_loss``), not in the reward.
    ``ref_logp=None`` (or ``kl_coef == 0``) drops the KL term. ``kl_clamp`` bounds the per-token
    k3 value (``loss.kl_clamp``), as for the evaluator's KL.

    ``is_weight [B, T]`` (``optim.rollout_correction``, :mod:`~score_lightning.step.rollout_correction`): a
    detached engine-trainer importance weight on each token's clipped surrogate; the KL term is not
    weighted by it (TRL's ``_compute_loss``). ``kl_is_weighted`` (``loss.kl_is_weighted``, TRL's
    ``use_bias_correction_kl``) multiplies the KL term by ``pi_theta / pi_old = exp(logp - old_logp)``,
    with its gradient: the k3 samples come from pi_old, and this makes the KL gradient the unbiased
    reverse-KL gradient (DeepSeek-V3.2). Its value is 1 on-policy; its gradient is not.

    Returns ``(loss_sum, stats)``. Divide ``loss_sum`` by the token count of the *whole*
    mini-batch (all micro-batches, all ranks), never by this micro-batch's own count: the sum of
    those terms then equals the full-batch token mean exactly, value and gradient (see the module
    docstring; verl PR #906, TRL #3021). ``stats`` holds detached masked sums ``pg``, ``kl``,
    ``clipfrac``, ``entropy`` and ``tokens``, so they too can be summed over micro-batches and
    divided once by the global ``tokens``. ``pg`` is the term as it enters the loss (IS-weighted).
    """
    pg, clipped = clipped_surrogate(logp, old_logp, advantages, clip_low=clip_low, clip_high=clip_high)
    if is_weight is not None:
        pg = pg * is_weight.detach().to(pg.dtype)
    per_token = pg
    if ref_logp is not None:
        kl = k3_kl(logp, ref_logp, kl_clamp=kl_clamp)  # logged unweighted (solver/kl)
        if kl_coef != 0.0:
            per_token = per_token + kl_coef * (kl * policy_ratio(logp, old_logp) if kl_is_weighted else kl)
    else:
        kl = torch.zeros_like(pg)
    if entropy is not None:
        if entropy_coef != 0.0:
            per_token = per_token - entropy_coef * entropy
    elif entropy_coef != 0.0:
        raise ValueError("entropy_coef != 0 needs the per-token entropy tensor")
    loss_sum = masked_sum(per_token, mask)
    with torch.no_grad():
        stats = {
            "pg": masked_sum(pg.detach(), mask),
            "kl": masked_sum(kl.detach(), mask),
            "clipfrac": masked_sum(clipped, mask),
            "entropy": masked_sum(entropy.detach().to(pg.dtype), mask)
            if entropy is not None
            else pg.new_zeros(()),
            "tokens": mask.bool().sum().to(pg.dtype),
        }
    return loss_sum, stats


def reinforce_loss(seq_logp_sum: Tensor, advantage: Tensor | float, alpha: float = 1.0) -> Tensor:
    """Evaluator REINFORCE loss ``mean_B(-alpha * A * sum_t log pi(rubric tokens))``.

    ``seq_logp_sum [B]`` is the summed log-prob of each sampled rubric (masked to its generated
    tokens). ``advantage`` is the EMA-baselined consistency reward ``R_eval - b`` (a float, or
    ``[B]`` / scalar tensor); it is detached, being a reward, not a function of θ. Minimising this
    with SGD is the paper's ascent ``θ += η α Â ∇ log π_e``: a positive advantage raises the
    sampled rubric's probability, a negative one lowers it. ``alpha`` is the evaluator/solver
    step ratio ``η_e / η_s``.
    """
    a = torch.as_tensor(advantage, dtype=seq_logp_sum.dtype, device=seq_logp_sum.device).detach()
    return (-alpha * a * seq_logp_sum).mean()
