"""Engine-trainer mismatch correction (``optim.rollout_correction``): detached importance weights pi_old / mu.

The rollout engine samples from mu (its own kernels, precision and batching); the trainer recomputes
pi_old with its own model on the same weights (DESIGN lesson 3). The two differ even at lr = 0
(lesson 7, open-instruct #1473), so a policy gradient estimated from mu's samples is biased towards mu.
Each token's policy-gradient term is therefore multiplied by a detached weight built from

    rho_t = exp(log pi_old(t) - log mu(t))   over model-written tokens (mask 1) only:

prompt, tool observations (mask 0) and padding never enter a ratio, a sum or a statistic.

Definitions as TRL 1.16's ``vllm_importance_sampling_mode`` (``trl/trainer/grpo_trainer.py``,
``_generate_and_score_completions`` and ``_compute_loss``, read in the trl-1.16.0 wheel):

* token modes use rho_t per token. Sequence modes use one ratio per sequence, the *product* of its
  tokens' ratios, exp(sum_t log rho_t) (TRL sums the masked log-ratio differences: no geometric
  mean), on every token of the sequence. A sequence is a trajectory: a MaMs trajectory's role calls
  (several rows) share one ratio (``sequence_ids``);
* ``*_truncate`` (TIS): w = clamp(rho, C_min, C_max);
* ``*_mask`` (MIS): w = rho inside [C_min, C_max] and 0 outside (TRL keeps rho inside, not 1);
* a token the engine recorded no log-prob for (NaN) has log rho_t = 0, as TRL's ``nan_to_num``.

The weight multiplies the clipped surrogate (after clipping), never the KL to the reference: TRL adds
``beta * per_token_kl`` after the IS multiplication, and so do :func:`~score_lightning.step.losses.grpo_token_loss`
and the evaluator's REINFORCE. ``loss.kl_is_weighted`` (TRL's ``use_bias_correction_kl``, DeepSeek-V3.2)
is a different factor, pi_theta / pi_old with its gradient, on the KL term. Tokens whose weight is 0
still count in the global token mean (TRL's ``mask.sum()``): masking shrinks the step instead of
re-weighting the other tokens.

Whose log-probs mu is (DESIGN lesson 8): the HF engine records log softmax(logits / T) over the full
vocabulary at every generated token, forced grammar tokens included (:mod:`~score_lightning.rollout.hf_engine`,
:mod:`~score_lightning.rollout.fast_forward`): exactly what the trainer recomputes, so rho = 1 to rounding
there (tests/test_rollout_correction_hf.py). vLLM records ``processed_logprobs``: after temperature *and*
top-p, renormalised over the nucleus, so with top-p < 1 every ratio would carry the kept mass S
(TRL #6789) rather than the engine-trainer gap; config validation refuses that combination.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from score_lightning.rollout.modes import stale_rollouts
from score_lightning.step.correction_modes import AUTO_VLLM, MODES, resolve_mode  # noqa: F401  (re-exported)

if TYPE_CHECKING:
    from score_lightning.config.schema import LossConfig, OptimConfig, RolloutConfig

__all__ = ["MODES", "ISWeights", "RolloutCorrection", "batch_correction", "behaviour_logprobs", "importance_weights",
           "mismatch_sums", "resolve_mode", "rollout_correction", "token_log_ratio", "weight_sums"]

_LOG_RATIO_CLAMP = 20.0  # for the k3 statistic only, as in losses.k3_kl: exp(20) is already far outside any bound


@dataclass(frozen=True)
class RolloutCorrection:
    """The resolved settings: a mode (never ``auto``), the bounds, and whether the KL is IS-weighted."""

    mode: str = "none"
    clip_min: float | None = None  # C_min; None: no lower bound
    clip_max: float = 3.0  # C_max (TRL's default); always set, so no weight is unbounded
    kl_is_weighted: bool = False  # loss.kl_is_weighted: KL term x pi_theta / pi_old

    @property
    def active(self) -> bool:
        return self.mode != "none"

    def outside_tag(self, prefix: str) -> str:
        """The tag counting tokens outside the bounds: zeroed (mask modes) or clamped (truncate modes)."""
        return f"{prefix}/is_masked_frac" if self.mode.endswith("_mask") else f"{prefix}/is_clipped_frac"

    def weights(self, old_logp: Tensor, behaviour_logp: Tensor, mask: Tensor,
                sequence_ids: Tensor | None = None) -> "ISWeights":
        return importance_weights(old_logp, behaviour_logp, mask, self.mode, self.clip_min, self.clip_max,
                                  sequence_ids)


def rollout_correction(optim: "OptimConfig", loss: "LossConfig", rollout: "RolloutConfig") -> RolloutCorrection:
    """The solver's and the evaluator's correction: ``optim.rollout_correction*`` and ``loss.kl_is_weighted``, with
    ``auto`` resolved for ``rollout.engine`` and whether its batches may be stale (``rollout.mode=async``)."""
    lo = optim.rollout_correction_clip_min
    return RolloutCorrection(resolve_mode(str(optim.rollout_correction), str(rollout.engine), stale_rollouts(rollout)),
                             None if lo is None else float(lo), float(optim.rollout_correction_clip_max),
                             bool(loss.kl_is_weighted))


@dataclass
class ISWeights:
    """Per-token weights and what they were made from, all ``[B, T]`` and detached."""

    weight: Tensor  # the factor on each token's policy-gradient term; 1 off the mask (never read there)
    outside: Tensor  # bool: a mask-1 token whose ratio (token or sequence) is outside [C_min, C_max]
    log_ratio: Tensor  # per-token log(pi_old / mu); 0 where not valid
    valid: Tensor  # bool: a mask-1 token with a finite behaviour log-prob


def behaviour_logprobs(rows: Sequence, shape: tuple[int, int]) -> Tensor:
    """Each row's engine log-probs in :func:`~score_lightning.step.batching.build_token_batch` layout, NaN elsewhere.

    ``rows`` have ``prompt_ids``, ``response_ids`` and ``engine_logprobs`` (trajectories, MaMs segments,
    rubric and step samples); response token j sits at column ``len(prompt) - 1 + j``. A row without one
    log-prob per response token stays NaN: nothing to correct it with.
    """
    out = torch.full(shape, math.nan, dtype=torch.float32)
    for i, r in enumerate(rows):
        lps, n = getattr(r, "engine_logprobs", None), len(r.response_ids)
        start = len(r.prompt_ids) - 1
        if not n or lps is None or len(lps) != n or start < 0:
            continue
        out[i, start:start + n] = torch.as_tensor(list(lps), dtype=torch.float32)
    return out


def token_log_ratio(old_logp: Tensor, behaviour_logp: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """``log pi_old - log mu`` on mask-1 tokens with a finite engine log-prob, else 0; and that validity mask."""
    behaviour_logp = behaviour_logp.to(old_logp.device)
    valid = mask.bool() & torch.isfinite(behaviour_logp)
    zero = torch.zeros((), dtype=torch.float32, device=old_logp.device)
    return torch.where(valid, old_logp.detach().float() - behaviour_logp.float(), zero), valid


def importance_weights(old_logp: Tensor, behaviour_logp: Tensor, mask: Tensor, mode: str,
                       clip_min: float | None = None, clip_max: float = 3.0,
                       sequence_ids: Tensor | None = None) -> ISWeights:
    """The detached weights of ``mode`` (see the module docstring); ``[B, T]`` inputs, ``mask`` 1 on model tokens.

    ``sequence_ids [B]`` (sequence modes): rows with the same id are one sequence and share one ratio
    (a MaMs trajectory's role calls); default: every row is its own sequence.
    """
    if mode not in MODES or mode == "none":
        raise ValueError(f"no importance weights for rollout_correction={mode!r}")
    lr, valid = token_log_ratio(old_logp, behaviour_logp, mask)
    keep = mask.bool().to(lr.device)
    if mode.startswith("sequence"):
        row = lr.sum(dim=1)
        if sequence_ids is not None:
            ids = torch.as_tensor(sequence_ids, dtype=torch.long, device=row.device)
            row = torch.zeros(int(ids.max()) + 1 if ids.numel() else 0, dtype=row.dtype,
                              device=row.device).index_add(0, ids, row)[ids]
        log_rho = row.unsqueeze(1).expand_as(lr)
    else:
        log_rho = lr
    rho = torch.exp(log_rho)  # a long sequence may overflow to inf: above C_max, so clamped or masked below
    lo = -math.inf if clip_min is None else float(clip_min)
    outside = keep & ((rho < lo) | (rho > clip_max))
    if mode.endswith("_truncate"):
        w = rho.clamp(min=clip_min, max=clip_max)
    else:
        w = torch.where(outside, torch.zeros_like(rho), rho)
    w = torch.where(keep, w, torch.ones_like(w))
    return ISWeights(w.detach(), outside, lr, valid)


def mismatch_sums(old_logp: Tensor, behaviour_logp: Tensor, mask: Tensor) -> dict[str, float]:
    """Token sums of the engine-trainer gap over mask-1 tokens with an engine log-prob (pooled by the caller).

    ``k3`` estimates KL(mu || pi_old) per token: the tokens are samples of mu, so with r = pi_old / mu
    (= rho), ``r - 1 - log r`` is Schulman's unbiased, non-negative k3 estimator of that KL. ``k1`` is the
    plain estimator ``-log r`` (unbiased, can be negative); ``exp(mean k1)`` is the perplexity ratio
    PPL(pi_old) / PPL(mu) over the same tokens, exp(mean(-log pi_old)) / exp(mean(-log mu)).
    """
    lr, valid = token_log_ratio(old_logp, behaviour_logp, mask)
    c = lr.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    k3 = torch.exp(c) - 1.0 - c
    return {"tokens": float(valid.sum()), "k3": float(k3[valid].double().sum()),
            "k1": float((-lr)[valid].double().sum())}


def weight_sums(w: ISWeights) -> dict[str, float]:
    """Sums of the weights and of the tokens outside the bounds, over the same tokens as :func:`mismatch_sums`."""
    return {"weight": float(w.weight[w.valid].double().sum()), "outside": float((w.outside & w.valid).sum())}


def batch_correction(corr: RolloutCorrection, old_logp: Tensor | None, rows: Sequence, mask: Tensor,
                     sequence_ids: Tensor | None = None) -> tuple[Tensor | None, dict[str, float]]:
    """The solver's weights for a whole batch (``None`` when the mode is ``none``) and the sums to log.

    Without trainer log-probs (``old_logp is None``: on-policy HF updates with the correction off) there
    is nothing to compare and nothing is logged.
    """
    if old_logp is None:
        return None, {}
    behaviour = behaviour_logprobs(rows, tuple(mask.shape))
    sums = mismatch_sums(old_logp, behaviour, mask)
    if not corr.active:
        return None, sums
    w = corr.weights(old_logp, behaviour, mask, sequence_ids)
    sums.update(weight_sums(w))
    return w.weight, sums


def logprob_mismatch(trajs: Sequence, trainer_lp: torch.Tensor) -> float | None:
    """Mean |engine - trainer| logprob over model-written response tokens with an engine log-prob (NaN: none).

    ``trainer_lp`` is ``[N, L-1]`` in :func:`~score_lightning.step.batching.build_token_batch` layout
    (position ``len(prompt) - 1 + j`` scores response token ``j``), computed on the weights that
    sampled ``trajs``. Trajectories without one engine logprob per response token are skipped.
    Returns None when nothing is comparable.
    """
    total, count = 0.0, 0
    for i, t in enumerate(trajs):
        n = len(t.response_ids)
        if n == 0 or len(t.engine_logprobs) != n:
            continue
        start = len(t.prompt_ids) - 1
        row = trainer_lp[i, start:start + n].detach().float().cpu()
        if row.numel() < n:
            continue
        mask = torch.as_tensor(t.response_mask[:n], dtype=torch.bool)
        eng = torch.as_tensor(t.engine_logprobs, dtype=torch.float32)
        mask &= torch.isfinite(eng)
        diff = (row - eng).abs()[mask]
        total += float(diff.sum())
        count += int(mask.sum())
    return total / count if count else None
