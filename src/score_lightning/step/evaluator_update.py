"""Stage 5b: Phase 2, the evaluator's REINFORCE update on the tokens that wrote the step's rubrics.

loss = mean_s(-A_s * sum_t log pi(token t of rubric s | its prompt)) + kl_coef * mean_t k3(pi, ref),
over the tokens up to the end of each rubric block (``RubricSample.train_mask``), stepped by the
evaluator's own AdamW at lr ``alpha * optim.lr`` (:mod:`score_lightning.step.optimizers`): alpha =
eta_e / eta_s is a step-size ratio, which a factor on the loss would not be under Adam. With
``evaluator.optimizer=shared`` the step goes through the solver's AdamW and the loss carries alpha. SCORE's single
rubric is the one rank 0 sampled and broadcast: every rank computes the same loss and DDP / FSDP2
average identical gradients, so the update equals one process training it once. Rubrics that
belong to queries (RLER items) differ by rank; every rank still makes exactly one forward and
backward (a masked dummy row when it has none), as data-parallel gradient averaging requires.

With ``optim.rollout_correction`` each rubric token's log-prob in the sum carries the detached weight of
:mod:`~score_lightning.step.rollout_correction` (a sequence mode: one weight per rubric), built from the
engine's log-probs of that rubric; the KL term is not weighted by it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from score_lightning.step.batching import TokenBatch, build_token_batch, policy_logprobs
from score_lightning.step.losses import k3_kl, masked_mean, policy_ratio, reinforce_loss
from score_lightning.step.rollout_correction import RolloutCorrection, behaviour_logprobs, weight_sums
from score_lightning.step.solver_update import OptimizerHooks
from score_lightning.step.types import RubricSample

if TYPE_CHECKING:
    from score_lightning.config.schema import ActorConfig, EvaluatorConfig, LossConfig


@dataclass(frozen=True)
class ReinforceSettings:
    temperature: float  # the rubric's sampling temperature (evaluator.temperature)
    alpha: float  # the loss's factor: 1 when alpha is the evaluator's lr ratio (optimizers.loss_alpha)
    kl_coef: float
    kl_clamp: float
    correction: RolloutCorrection  # optim.rollout_correction, as for the solver


def reinforce_settings(evaluator: "EvaluatorConfig", loss: "LossConfig", actor: "ActorConfig",
                       correction: RolloutCorrection) -> ReinforceSettings:
    """Phase 2's plan: the rubric's temperature, the loss's alpha (``evaluator.optimizer`` and ``actor.shared``), the
    KL of ``loss``, and the run's engine-trainer ``correction`` (the solver's)."""
    from score_lightning.step.optimizers import loss_alpha

    return ReinforceSettings(float(evaluator.temperature), loss_alpha(evaluator, actor), float(loss.kl_coef),
                             float(loss.kl_clamp), correction)


def rubric_batch(samples: Sequence[RubricSample], pad_id: int) -> TokenBatch:
    """The samples as rows; with none, one fully masked row so the rank still joins the backward."""
    if not samples:
        return build_token_batch([[pad_id]], [[pad_id]], [[0]], pad_id)
    return build_token_batch([s.prompt_ids for s in samples], [s.response_ids for s in samples],
                             [s.train_mask for s in samples], pad_id)


def rubric_logprobs(model: nn.Module, batch: TokenBatch, temperature: float):
    """Per-row summed log-probability of the trained rubric tokens, and the per-token log-probs."""
    logp, _ = policy_logprobs(model, batch, temperature)
    return (logp * batch.loss_mask).sum(dim=1), logp


def evaluator_update(model: nn.Module, ref: nn.Module | None, samples: Sequence[RubricSample],
                     advantages: Sequence[float], settings: ReinforceSettings, pad_id: int,
                     hooks: OptimizerHooks) -> dict[str, float]:
    """One REINFORCE step over this rank's rubric samples. Collective under data parallelism.

    A sample is anything with ``prompt_ids``, ``response_ids`` and ``train_mask``: rubric samples, and
    with ``reward.step=rubric`` also the step judgements (``step_rewards.StepSample``), folded in by
    ``StepJudgement.fold`` so the rank still makes exactly one backward per step.
    """
    batch = rubric_batch(samples, pad_id).to(hooks.device)
    seq_lp, logp = rubric_logprobs(model, batch, settings.temperature)
    adv = torch.tensor(list(advantages) if samples else [0.0], dtype=seq_lp.dtype, device=seq_lp.device)
    corr, out = settings.correction, {}
    trained_lp = seq_lp
    if corr.active and samples:
        # pi_old is the model as it is now (after the solver's step under a shared actor): the weight corrects
        # the sampled rubric to the policy REINFORCE differentiates, engine gap and any drift since sampling
        w = corr.weights(logp.detach(), behaviour_logprobs(samples, tuple(batch.loss_mask.shape)), batch.loss_mask)
        trained_lp = (w.weight * logp * batch.loss_mask).sum(dim=1)
        sums = weight_sums(w)
        n = max(float(w.valid.sum()), 1.0)
        out = {"evaluator/is_weight_mean": sums["weight"] / n, corr.outside_tag("evaluator"): sums["outside"] / n}
    loss = reinforce_loss(trained_lp, adv, settings.alpha)
    kl_value = 0.0
    if settings.kl_coef > 0 and ref is not None:
        with torch.no_grad():
            ref_lp, _ = policy_logprobs(ref, batch, settings.temperature)
        per_token = k3_kl(logp, ref_lp, kl_clamp=settings.kl_clamp)
        kl = masked_mean(per_token, batch.loss_mask)
        if corr.kl_is_weighted:  # loss.kl_is_weighted: value unchanged (pi_old = pi_theta here), gradient not
            loss = loss + settings.kl_coef * masked_mean(per_token * policy_ratio(logp, logp.detach()), batch.loss_mask)
        else:
            loss = loss + settings.kl_coef * kl
        kl_value = float(kl.detach())
    hooks.backward(loss)
    norm, ok = hooks.step()
    out.update({"evaluator/loss": float(loss.detach()), "evaluator/kl": kl_value, "evaluator/grad_norm": norm,
                "evaluator/rubric_logprob": float(seq_lp.detach().sum()), "evaluator/updated": float(ok)})
    return out
