"""Stage 4: Phase 1, the solver's GRPO update on the shared actor.

Group-normalised advantages over each query's K rewards; PPO mini-batches, micro-batches and
epochs; clipped surrogate plus the k3 KL to the frozen reference *in the loss*; an exact global
token mean (every micro-batch is divided by the token count of its whole mini-batch across all
ranks, verl PR #906 / TRL #3021). ``optim.mini_batch_size`` counts queries of the *global* batch:
each data-parallel rank takes its equal share, so one optimiser step sees the same queries on 1
GPU as on 4 (the paper's 64 queries / 32 per mini-batch = 2 optimiser steps per epoch).

Rows (:mod:`~score_lightning.step.solver_rows`): a ReAct trajectory is one row, a MaMs trajectory one
row per role call, each with its trajectory's advantage; with step-level rewards the advantage is
per token (``step_bonus``), which the clipped surrogate takes as ``[B, T]``.

Engine-trainer correction (``optim.rollout_correction``, :mod:`~score_lightning.step.rollout_correction`):
pi_old is then always recomputed before the first optimiser step, and each token's surrogate carries
the detached weight built from pi_old / mu (the engine's log-probs), the same weight in every epoch.

Variants (:mod:`~score_lightning.step.loss_registry`): ``optim.loss_type`` looks up the surrogate and the
normaliser (the counts it needs are summed over the mini-batch, or the step, and over ranks here);
``optim.scale_rewards`` the advantage's scale; ``reward.overlong`` adds DAPO's length penalty to the
rewards before the advantages (dynamic sampling decided on the task reward, as verl's DAPO filters on
accuracy); ``solver.mask_truncated`` takes a truncated trajectory's tokens out of the loss and out of
every token count, after it took part in its group's advantages (TRL's ``mask_truncated_completions``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from score_lightning import distributed as D
from score_lightning.step.batching import TokenBatch, build_token_batch, policy_logprobs
from score_lightning.step.loss_registry import loss_scale, normaliser, policy_loss, scaled_advantages
from score_lightning.step.loss_variants import default_buffer_len, overlong_penalty
from score_lightning.step.rollout_correction import RolloutCorrection, batch_correction
from score_lightning.rollout.trajectory import Trajectory
from score_lightning.rollout.workflows import SOLVER_WORKFLOWS
from score_lightning.step.solver_rows import TokenBonus, token_advantages, training_rows

if TYPE_CHECKING:
    from score_lightning.config.schema import LossConfig, OptimConfig, RewardConfig, SolverConfig


@dataclass(frozen=True)
class GRPOSettings:
    num_rollouts: int  # K
    temperature: float  # the solver's sampling temperature: log-probs must describe that distribution
    mini_batch_queries: int  # global queries per optimiser step
    micro_batch_size: int  # trajectories per forward/backward on this device
    ppo_epochs: int
    clip_low: float
    clip_high: float
    kl_coef: float
    kl_clamp: float
    entropy_coef: float
    adv_eps: float
    share_prompt: bool  # one packed forward per prompt group (optim.share_prompt_forward)
    correction: RolloutCorrection  # optim.rollout_correction (engine-trainer IS weights)
    loss_type: str  # optim.loss_type (step/loss_registry.py)
    scale_rewards: str  # optim.scale_rewards: group | batch | none
    max_response_tokens: int  # a trajectory's most response tokens: dr_grpo's constant, reward.overlong's cap
    mask_truncated: bool  # solver.mask_truncated
    overlong: "OverlongShaping | None"  # reward.overlong (None: off)

    def mini_batches(self, num_queries: int, world: int) -> list[list[int]]:
        """This rank's trajectory rows of each optimiser step.

        Every rank takes ``mini_batch_size / world`` of its queries per step. They are taken *strided*
        (query q goes to mini-batch ``q mod n``), so mini-batch j holds the same global queries on any
        number of ranks: rank r's local query i is global query ``r * L + i`` and L is a multiple of n.
        One process on the global batch and several processes on its shards make identical updates.
        """
        if self.mini_batch_queries % world:
            raise ValueError(f"optim.mini_batch_size={self.mini_batch_queries} counts global queries and must be "
                             f"divisible by the {world} data-parallel processes")
        per_rank = self.mini_batch_queries // world
        n = max(1, -(-num_queries // per_rank))
        k = self.num_rollouts
        return [[q * k + j for q in range(num_queries) if q % n == m for j in range(k)] for m in range(n)]


def grpo_settings(solver: "SolverConfig", optim: "OptimConfig", loss: "LossConfig", reward: "RewardConfig",
                  correction: RolloutCorrection) -> GRPOSettings:
    """Phase 1's plan: the group size and the solver's temperature, ``optim``'s batches, clip and loss variant,
    ``loss``'s KL and entropy terms, ``reward.overlong``'s shaping; ``correction`` is the run's engine-trainer
    correction (:func:`~score_lightning.step.rollout_correction.rollout_correction`), shared with the evaluator."""
    o = optim
    return GRPOSettings(int(solver.num_rollouts), float(solver.temperature), int(o.mini_batch_size),
                        int(o.micro_batch_size), int(o.ppo_epochs), float(o.clip_ratio_low), float(o.clip_ratio_high),
                        float(loss.kl_coef), float(loss.kl_clamp), float(loss.entropy_coef), float(loss.adv_eps),
                        bool(o.share_prompt_forward), correction=correction, loss_type=str(o.loss_type),
                        scale_rewards=str(o.scale_rewards), max_response_tokens=trajectory_cap(solver),
                        mask_truncated=bool(solver.mask_truncated), overlong=overlong_shaping(reward, solver))


def trajectory_cap(solver: "SolverConfig") -> int:
    """The most response tokens one trajectory holds, as the run's workflow says (``SolverWorkflow.trajectory_tokens``):
    ``solver.max_response_tokens``, or under ``solver.agent=mams`` (one trajectory, many role calls, each with its own
    budget) the sum of its role calls' budgets, so that dr_grpo's sequence is the whole trajectory, not one role call."""
    return SOLVER_WORKFLOWS.get(str(solver.agent)).trajectory_tokens(solver)


@dataclass(frozen=True)
class OverlongShaping:
    """``reward.overlong``: DAPO's soft penalty over the last ``buffer_len`` tokens before the cap ``max_len``.

    A trajectory's length is what the cap counts: its whole response, observations included
    (``solver.max_response_tokens``), so the buffer sits before the point where the agent loop cuts it.
    """

    max_len: int
    buffer_len: int
    factor: float = 1.0

    def penalty(self, trajs: Sequence[Trajectory]) -> Tensor:
        lengths = torch.tensor([len(t.response_ids) for t in trajs], dtype=torch.float32)
        return overlong_penalty(lengths, self.max_len, self.buffer_len, self.factor)


def overlong_shaping(reward: "RewardConfig", solver: "SolverConfig") -> OverlongShaping | None:
    """``reward.overlong`` against the cap ``solver.max_response_tokens`` (``buffer_len`` null: a fifth of it), or
    None when it is off."""
    ov = reward.overlong
    if not bool(ov.enabled):
        return None
    cap = int(solver.max_response_tokens)
    buf = ov.buffer_len
    return OverlongShaping(cap, default_buffer_len(cap) if buf is None else int(buf), float(ov.penalty_factor))


@dataclass
class OptimizerHooks:
    """What the update needs from Lightning: backward, and one optimiser step (clip, finite check, step)."""

    backward: Callable[[Tensor], None]
    step: Callable[[], tuple[float, bool]]  # -> (pre-clip grad norm, stepped)
    device: torch.device


@dataclass
class SolverUpdateResult:
    """Local sums (pooled over ranks by the caller) and per-row advantages."""

    advantages: Tensor  # [N] per trajectory
    sums: dict[str, float] = field(default_factory=dict)  # pg, kl, clipfrac, entropy, loss, tokens
    grad_norms: list[float] = field(default_factory=list)
    updates: int = 0
    trainer_logprobs: Tensor | None = None  # pre-update log-probs [rows, L-1] (for the engine mismatch metric)
    rows: list = field(default_factory=list)  # the trained rows (trajectories, or MaMs segments), as in trainer_logprobs
    correction: dict[str, float] = field(default_factory=dict)  # engine-trainer gap and IS-weight sums
    overlong: Tensor | None = None  # [N] reward.overlong's penalty per trajectory (None: off)


def chunked_logprobs(model: nn.Module, batch: TokenBatch, temperature: float, micro: int, device,
                     share_prompt: bool = False) -> Tensor:
    """Per-token log-probs of a whole batch, ``micro`` rows at a time, on the CPU."""
    out = torch.zeros_like(batch.loss_mask)
    for s in range(0, batch.input_ids.shape[0], micro):
        idx = list(range(s, min(s + micro, batch.input_ids.shape[0])))
        lp, _ = policy_logprobs(model, batch.rows(idx).to(device), temperature, share_prompt=share_prompt)
        out[idx, : lp.shape[1]] = lp.float().cpu()
    return out


def solver_update(policy: nn.Module, ref: nn.Module | None, trajs: Sequence[Trajectory], rewards: Tensor,
                  settings: GRPOSettings, pad_id: int, hooks: OptimizerHooks,
                  need_trainer_logprobs: bool = False,
                  step_bonus: Sequence[Sequence[TokenBonus]] | None = None,
                  neutral: Tensor | None = None, exclude: Tensor | None = None) -> SolverUpdateResult:
    """GRPO over this rank's trajectories (query-major, K per query). Collective under data parallelism.

    ``step_bonus`` (one list per trajectory): per-token additions to the trajectory advantage.
    Incomplete evaluations (``evaluator.on_incomplete``, see ``step/reward_assembly.py``):
    ``neutral`` ([N] bool) trajectories get advantage 0, step and stage credit included, but stay in the
    loss (their tokens count in the token-mean denominator and feel the KL); ``exclude`` ([N] bool)
    trajectories leave the update: their group's advantages are normalised over the rest, and their tokens
    count nowhere.
    """
    s = settings
    include = None if exclude is None else ~exclude.to(torch.bool)
    overlong = s.overlong.penalty(trajs) if s.overlong is not None else None
    shaped = rewards if overlong is None else rewards + overlong.to(rewards.device)
    adv = scaled_advantages(shaped, s.num_rollouts, s.scale_rewards, eps=s.adv_eps, include=include,
                            batch_std=lambda: _global_reward_std(shaped, include))  # read by the batch scaling only
    if neutral is not None:
        adv = adv.masked_fill(neutral.to(adv.device), 0.0)
        if step_bonus is not None:  # a neutral group says nothing: no step or stage credit on top of its 0 either
            step_bonus = [[] if n else list(b) for b, n in zip(step_bonus, neutral.tolist())]
    tr = training_rows(trajs)
    batch = build_token_batch([t.prompt_ids for t in tr.rows], [t.response_ids for t in tr.rows],
                              [t.response_mask for t in tr.rows], pad_id)
    owner = torch.as_tensor(tr.owner, dtype=torch.long)
    if exclude is not None and tr.rows:
        batch.loss_mask[exclude.to(torch.bool)[owner]] = 0.0
    if s.mask_truncated and tr.rows:  # the rows of a truncated trajectory leave the loss (TRL's mask_truncated_completions)
        batch.loss_mask[torch.tensor([t.truncated for t in trajs], dtype=torch.bool)[owner]] = 0.0
    row_adv = adv[owner] if tr.rows else adv
    tok_adv = token_advantages(batch, tr, adv, step_bonus) if step_bonus is not None else None
    traj_batches = s.mini_batches(len(trajs) // s.num_rollouts, D.world_size())
    mini_batches = [tr.of(mb) for mb in traj_batches]
    off_policy = s.ppo_epochs > 1 or len(mini_batches) > 1
    old_lp = ref_lp = None
    with torch.no_grad():
        if off_policy or need_trainer_logprobs or s.correction.active:  # pi_old: the policy moves after one step
            old_lp = chunked_logprobs(policy, batch, s.temperature, s.micro_batch_size, hooks.device, s.share_prompt)
        if s.kl_coef > 0 and ref is not None:
            ref_lp = chunked_logprobs(ref, batch, s.temperature, s.micro_batch_size, hooks.device, s.share_prompt)
    is_w, corr_sums = batch_correction(s.correction, old_lp, tr.rows, batch.loss_mask, owner)
    result = SolverUpdateResult(adv, {k: 0.0 for k in ("pg", "kl", "clipfrac", "entropy", "tokens", "loss")},
                                trainer_logprobs=old_lp, rows=tr.rows, correction=corr_sums, overlong=overlong)
    result.sums.update(objective=0.0, steps=0.0)
    world = D.world_size()
    gathers = normaliser(s.loss_type).gathers  # the counts the normaliser reads beyond the mini-batch's tokens
    step_tokens = D.global_sum(float(batch.num_tokens)) if "step_tokens" in gathers else 0.0
    for _epoch in range(s.ppo_epochs):
        for rows, mb_trajs in zip(mini_batches, traj_batches):
            mb = batch.rows(rows)
            mb_tokens = D.global_sum(float(mb.num_tokens))
            if mb_tokens == 0:  # same on every rank: all skip together
                continue
            counts = _normaliser_counts(s, gathers, mb, len(mb_trajs), world, mb_tokens, step_tokens, len(mini_batches))
            n_micro = -(-len(rows) // s.micro_batch_size)
            for ms in range(0, len(rows), s.micro_batch_size):
                idx = rows[ms:ms + s.micro_batch_size]
                sub = batch.rows(idx).to(hooks.device)
                width = sub.loss_mask.shape[1]
                logp, ent = policy_logprobs(policy, sub, s.temperature, with_entropy=True, entropy_grad=s.entropy_coef > 0,
                                            share_prompt=s.share_prompt)
                old = old_lp[idx, :width].to(hooks.device) if (old_lp is not None and off_policy) else logp.detach()
                ref_rows = ref_lp[idx, :width].to(hooks.device) if ref_lp is not None else None
                a = tok_adv[idx, :width] if tok_adv is not None else row_adv[idx]  # [B, T] with step rewards, else [B]
                loss_sum, st = policy_loss(
                    logp, old, ref_rows, a.to(hooks.device), sub.loss_mask, loss_type=s.loss_type, clip_low=s.clip_low,
                    clip_high=s.clip_high, kl_coef=s.kl_coef, entropy_coef=s.entropy_coef, entropy=ent,
                    kl_clamp=s.kl_clamp, is_weight=is_w[idx, :width].to(hooks.device) if is_w is not None else None,
                    kl_is_weighted=s.correction.kl_is_weighted,
                )
                # DDP/FSDP average gradients over ranks: a batch normaliser carries the world size (loss_scale)
                factor = loss_scale(s.loss_type, micro_tokens=float(st["tokens"]), micro_batches=n_micro, **counts)
                hooks.backward(loss_sum * factor)
                for key in ("pg", "kl", "clipfrac", "entropy", "tokens", "loss"):
                    result.sums[key] += float(st[key])
                result.sums["objective"] += float(loss_sum.detach()) * factor / world  # summed over ranks: the objective
            norm, ok = hooks.step()
            result.sums["steps"] += 1.0 / world
            result.grad_norms.append(norm)
            result.updates += int(ok)
    return result


def _normaliser_counts(s: GRPOSettings, gathers: frozenset[str], mb: TokenBatch, trajectories: int, world: int,
                       mb_tokens: float, step_tokens: float, mini_batches: int) -> dict:
    """The global counts (:class:`~score_lightning.step.loss_registry.Counts`) the normaliser of ``s.loss_type``
    reads: a collective only for a count it ``gathers``, so the same on every rank."""
    counts = dict(world=world, mini_tokens=mb_tokens, step_tokens=step_tokens, mini_batches=mini_batches,
                  max_len=s.max_response_tokens)
    if "mini_trajectories" in gathers:  # the mini-batch's trajectories (masked ones too: a constant), over all ranks
        counts["mini_trajectories"] = D.global_sum(float(trajectories))
    if "mini_sequences" in gathers:  # rows with a trained token
        counts["mini_sequences"] = D.global_sum(float((mb.loss_mask.sum(dim=1) > 0).sum()))
    return counts


def _global_reward_std(rewards: Tensor, include: Tensor | None) -> float:
    """The unbiased std of the (included) rewards of the global batch (``optim.scale_rewards=batch``)."""
    r = rewards.detach().double()
    if include is not None:
        r = r[include.to(torch.bool)]
    n = D.global_sum(float(r.numel()))
    if n < 2:
        return 0.0
    mean = D.global_sum(float(r.sum())) / n
    return math.sqrt(D.global_sum(float(((r - mean) ** 2).sum())) / (n - 1))
