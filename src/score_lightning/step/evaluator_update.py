"""Stage 5b: Phase 2, the evaluator's REINFORCE update on the step's rubric tokens.

loss = -alpha * A * sum_t log pi(rubric token t | rubric prompt) + kl_coef * mean_t k3(pi, ref),
over the tokens up to the end of ``</dimensions>`` (``RubricSample.train_mask``). The rubric is the
one rank 0 sampled and broadcast (see ``rubric_stage``): every rank computes this same loss, and
DDP / FSDP2 average identical gradients, so the update equals one process training the rubric once
(no rescaling by the world size, unlike the solver's token sums).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from score_lightning.batching import build_token_batch, policy_logprobs
from score_lightning.losses import k3_kl, masked_mean, reinforce_loss
from score_lightning.step.solver_update import OptimizerHooks
from score_lightning.step.types import RubricSample


@dataclass(frozen=True)
class ReinforceSettings:
    temperature: float  # the rubric's sampling temperature (evaluator.temperature)
    alpha: float
    kl_coef: float
    kl_clamp: float

    @classmethod
    def from_cfg(cls, cfg) -> "ReinforceSettings":
        return cls(float(cfg.evaluator.temperature), float(cfg.evaluator.alpha), float(cfg.loss.kl_coef),
                   float(cfg.loss.kl_clamp))


def rubric_logprob(model: nn.Module, sample: RubricSample, temperature: float, pad_id: int, device) -> torch.Tensor:
    """Summed log-probability of the trained rubric tokens (with grad when enabled)."""
    batch = build_token_batch([sample.prompt_ids], [sample.response_ids], [sample.train_mask], pad_id).to(device)
    logp, _ = policy_logprobs(model, batch, temperature)
    return (logp * batch.loss_mask).sum(dim=1), logp, batch


def evaluator_update(model: nn.Module, ref: nn.Module | None, sample: RubricSample, advantage: float,
                     settings: ReinforceSettings, pad_id: int, hooks: OptimizerHooks) -> dict[str, float]:
    """One REINFORCE step. Collective under data parallelism (every rank runs it on the same sample)."""
    seq_lp, logp, batch = rubric_logprob(model, sample, settings.temperature, pad_id, hooks.device)
    loss = reinforce_loss(seq_lp, advantage, settings.alpha)
    kl_value = 0.0
    if settings.kl_coef > 0 and ref is not None:
        with torch.no_grad():
            ref_lp, _ = policy_logprobs(ref, batch, settings.temperature)
        kl = masked_mean(k3_kl(logp, ref_lp, kl_clamp=settings.kl_clamp), batch.loss_mask)
        loss = loss + settings.kl_coef * kl
        kl_value = float(kl.detach())
    hooks.backward(loss)
    norm, ok = hooks.step()
    return {"evaluator/loss": float(loss.detach()), "evaluator/kl": kl_value, "evaluator/grad_norm": norm,
            "evaluator/rubric_logprob": float(seq_lp.detach().sum()), "evaluator/updated": float(ok)}
