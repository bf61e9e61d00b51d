"""``solver.objective=dpo``: the paper's DPO baseline as Phase 1, online, from the step's own scored groups.

Why here and not in the step: it is a relative of SCORE, so it plugs into the core's ``solver.objective`` extension
point (:mod:`score_lightning.step.solver_objective`) and the core never names it. Per query, the best and the worst
judged report form a pair when their rewards differ (:func:`~score_lightning.methods.dpo.loss.select_pairs`); a
report an evaluation did not finish (unjudged, a neutral group, one that leaves the update, or a truncated one under
``solver.mask_truncated``) competes in no pair. Each side's log-probability sums the tokens the policy wrote, under
the policy (with gradient) and under the frozen reference the run already keeps (without), and
:func:`~score_lightning.methods.dpo.loss.dpo_loss` (TRL's, ``solver.dpo``) is averaged over the step's pairs.

Exact under micro-batching and data parallelism: a micro-batch holds ``optim.micro_batch_size // 2`` pairs, and its
loss sum is divided by the number of pairs over every micro-batch and rank (times the world size, which DDP's gradient
mean divides out), so the gradient is that of the one global mean. A rank with fewer micro-batches backs a zero loss
for the missing ones, so every rank makes the same number of backward calls. Each of ``optim.ppo_epochs`` is one
optimiser step over all pairs, through the same hooks as GRPO (clipping, the finite check, the fault count); a step
with no pair on any rank makes none and logs ``solver/dpo_pairs`` 0 and ``solver/updates`` 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from score_lightning import distributed as D
from score_lightning.methods.dpo.config import check
from score_lightning.methods.dpo.loss import dpo_loss, select_pairs, sequence_logps
from score_lightning.step.batching import TokenBatch, build_token_batch, policy_logprobs
from score_lightning.step.scalars import StepScalars
from score_lightning.step.solver_objective import (SOLVER_OBJECTIVES, SolverInputs, SolverObjective,
                                                   SolverObjectiveEntry)
from score_lightning.step.solver_rows import TrainingRows, training_rows
from score_lightning.step.solver_update import SolverUpdateResult

if TYPE_CHECKING:
    from score_lightning.config.schema import OptimConfig, SolverConfig

#: the sums an update keeps (pooled over ranks by ``record``); ``seen`` counts pairs over epochs
SUMS = ("loss", "chosen", "rejected", "margin", "accuracy", "seen")


@dataclass(frozen=True)
class DPOSettings:
    """What the DPO update reads of the run config."""

    num_rollouts: int  # K: the reports of one query, of which the best and the worst form its pair
    beta: float  # solver.dpo.beta
    loss_type: str  # solver.dpo.loss_type: sigmoid | robust
    label_smoothing: float  # solver.dpo.label_smoothing (robust only)
    temperature: float  # solver.temperature: the log-probs describe the distribution the reports were sampled from
    micro_batch_size: int  # optim.micro_batch_size: trajectories per forward, so micro_batch_size // 2 pairs
    epochs: int  # optim.ppo_epochs: optimiser steps over the step's pairs
    share_prompt: bool  # optim.share_prompt_forward: a pair shares its prompt
    mask_truncated: bool  # solver.mask_truncated: a truncated report competes in no pair

    @property
    def pairs_per_micro(self) -> int:
        return max(1, self.micro_batch_size // 2)


def dpo_settings(solver: "SolverConfig", optim: "OptimConfig") -> DPOSettings:
    """DPO's settings from the two nodes it reads: ``solver`` (``solver.dpo``, K, the sampling temperature, the
    truncation mask) and ``optim`` (micro-batching, epochs, the shared prompt forward)."""
    d = solver.dpo
    return DPOSettings(int(solver.num_rollouts), float(d.beta), str(d.loss_type), float(d.label_smoothing),
                       float(solver.temperature), int(optim.micro_batch_size), int(optim.ppo_epochs),
                       bool(optim.share_prompt_forward), bool(solver.mask_truncated))


@dataclass
class DPOUpdate(SolverUpdateResult):
    """The update's record: no advantages (empty), this rank's pairs as ``(chosen, rejected)`` trajectory rows."""

    pairs: list[tuple[int, int]] = field(default_factory=list)


def competing(x: SolverInputs, mask_truncated: bool) -> list[bool]:
    """Per trajectory: may it be a pair's chosen or rejected report? Judged, not neutral, not left out."""
    ok = x.judged.to(torch.bool).clone()
    for mask in (x.neutral, x.exclude):
        if mask is not None:
            ok &= ~mask.to(torch.bool)
    if mask_truncated:
        ok &= ~torch.tensor([bool(t.truncated) for t in x.trajectories], dtype=torch.bool)
    return ok.tolist()


def trajectory_logps(model: nn.Module, batch: TokenBatch, rows: TrainingRows, trajectories: Sequence[int],
                     temperature: float, device, share_prompt: bool) -> Tensor:
    """``[len(trajectories)]``: each trajectory's written tokens' log-prob sum under ``model``, summed over its rows
    (one for ReAct, one per role call for MaMs); differentiable when grad is on."""
    index = rows.of(trajectories)
    sub = batch.rows(index).to(device)
    logp, _ = policy_logprobs(model, sub, temperature, share_prompt=share_prompt)
    per_row = sequence_logps(logp.float(), sub.loss_mask)
    local = {t: i for i, t in enumerate(trajectories)}
    owner = torch.tensor([local[rows.owner[r]] for r in index], dtype=torch.long, device=per_row.device)
    return per_row.new_zeros(len(trajectories)).index_add(0, owner, per_row)


class DPOObjective(SolverObjective):
    """Online DPO on the best and the worst report of each query (module docstring)."""

    def __init__(self, settings: DPOSettings):
        self.settings = settings

    def update(self, x: SolverInputs) -> DPOUpdate:
        s = self.settings
        if x.ref is None:
            raise ValueError("solver.objective=dpo needs the frozen reference; it is loaded while loss.kl_coef > 0")
        pairs = select_pairs(x.rewards.tolist(), s.num_rollouts, competing(x, s.mask_truncated))
        result = DPOUpdate(torch.zeros(0), dict.fromkeys(SUMS, 0.0), pairs=pairs)
        total = D.global_sum(float(len(pairs)))  # the same on every rank
        if total == 0:
            return result  # no backward and no optimiser step anywhere
        rows = training_rows(x.trajectories)
        batch = build_token_batch([t.prompt_ids for t in rows.rows], [t.response_ids for t in rows.rows],
                                  [t.response_mask for t in rows.rows], x.pad_id)
        chunks = [pairs[i:i + s.pairs_per_micro] for i in range(0, len(pairs), s.pairs_per_micro)]
        micro_batches = int(D.global_max(float(len(chunks))))
        with torch.no_grad():
            refs = [self._sides(x.ref, batch, rows, chunk, x.hooks.device) for chunk in chunks]
        world = D.world_size()
        for _epoch in range(s.epochs):
            for m in range(micro_batches):
                if m >= len(chunks):  # this rank ran out of pairs: a zero loss keeps DDP's all-reduces in step
                    logp = trajectory_logps(x.policy, batch, rows, [0], s.temperature, x.hooks.device, s.share_prompt)
                    x.hooks.backward(logp.sum() * 0.0)
                    continue
                chosen, rejected = self._sides(x.policy, batch, rows, chunks[m], x.hooks.device)
                losses, r_chosen, r_rejected = dpo_loss(chosen, rejected, *refs[m], s.beta, s.loss_type,
                                                        s.label_smoothing)
                x.hooks.backward(losses.sum() * (world / total))
                self._add(result.sums, losses.detach(), r_chosen, r_rejected)
            norm, ok = x.hooks.step()
            result.grad_norms.append(norm)
            result.updates += int(ok)
        return result

    def _sides(self, model: nn.Module, batch: TokenBatch, rows: TrainingRows, chunk: list[tuple[int, int]],
               device) -> tuple[Tensor, Tensor]:
        """The chosen and the rejected reports' sequence log-probs of one micro-batch of pairs, in one forward."""
        s = self.settings
        both = trajectory_logps(model, batch, rows, [c for c, _ in chunk] + [r for _, r in chunk], s.temperature,
                                device, s.share_prompt)
        return both[:len(chunk)], both[len(chunk):]

    @staticmethod
    def _add(sums: dict[str, float], losses: Tensor, r_chosen: Tensor, r_rejected: Tensor) -> None:
        sums["loss"] += float(losses.sum())
        sums["chosen"] += float(r_chosen.sum())
        sums["rejected"] += float(r_rejected.sum())
        sums["margin"] += float((r_chosen - r_rejected).sum())
        sums["accuracy"] += float((r_chosen > r_rejected).float().sum())  # TRL's rewards/accuracies: a tie is wrong
        sums["seen"] += float(losses.numel())

    def record(self, scalars: StepScalars, result: SolverUpdateResult) -> dict[str, float]:
        """TRL's rewards/chosen, rejected, margins and accuracies, and the loss, pooled over every pair of every
        epoch and rank; the step's pair count; the gradient norm and the optimiser steps made."""
        sums, seen = result.sums, result.sums["seen"]
        scalars.sum("solver/dpo_pairs", float(len(getattr(result, "pairs", []))))
        scalars.mean("solver/dpo_loss", sums["loss"], seen)
        for key in ("chosen", "rejected", "margin", "accuracy"):
            scalars.mean(f"solver/dpo_reward_{key}", sums[key], seen)
        return super().record(scalars, result)


SOLVER_OBJECTIVES.register("dpo", SolverObjectiveEntry(lambda cfg: DPOObjective(dpo_settings(cfg.solver, cfg.optim)),
                                                      check))
