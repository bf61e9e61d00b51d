"""What a SCORE step logs: this rank's raw numbers fed into :class:`StepScalars` for cross-rank pooling.

Tags are the public TensorBoard names (docs/TENSORBOARD.md). Each call below is made
on every rank in the same order (``StepScalars.compute`` is collective), so nothing here may
depend on rank-local conditions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from score_lightning.registry import Registry
from score_lightning.step.dynamic_sampling import informative_groups
from score_lightning.step.reward_assembly import StepRewards
from score_lightning.step.rollout_correction import RolloutCorrection
from score_lightning.step.scalars import StepScalars
from score_lightning.step.solver_update import SolverUpdateResult
from score_lightning.step.types import StepRollouts

if TYPE_CHECKING:
    from score_lightning.config.schema import RewardConfig, VerifierConfig

#: ``solver.agent``: what a workflow's trajectories add to the step's scalars, ``(scalars, trajectories) -> None``;
#: a trajectory names its workflow in ``meta["agent"]`` (a workflow that names none adds nothing)
ROLLOUT_SCALARS: Registry[Callable[[StepScalars, list], None]] = Registry("solver.agent")


def record_step(sc: StepScalars, ro: StepRollouts, rw: StepRewards, drawn: tuple[float, float, float],
                reward: "RewardConfig", verifier: "VerifierConfig", num_rollouts: int) -> None:
    """What every step records of its rollouts and rewards, before the updates: the rewards (as ``verifier`` gated
    them), the rollouts, the ranking (by ``reward.rule_quality``), and dynamic sampling's zero-variance groups and
    draws (``drawn``: groups without variance, groups, draws)."""
    record_rewards(sc, ro, rw, num_rollouts, bool(verifier.enabled), str(verifier.zero))
    record_rollouts(sc, ro)
    items = reward.items_path
    record_ranking(sc, ro, rw, num_rollouts, str(reward.rule_quality), None if items is None else str(items))
    sc.mean("solver/zero_variance_group_rate", drawn[0], drawn[1])
    sc.max("solver/sampling_draws", drawn[2])


def record_rewards(sc: StepScalars, ro: StepRollouts, rw: StepRewards, num_rollouts: int, verifier_enabled: bool,
                   zero: str) -> None:
    """Rewards, their decomposition, validity, verification and the groups without a gradient. The reward means
    pool the reports whose reward was measured (``StepRewards.rewarded``), the score part the judged ones: an
    unjudged report's row of zeros is no score (what the meta-harness reads from these tags)."""
    n = len(rw.rewards)
    kept = rw.rewarded
    sc.reward.update(rw.validity[kept], rw.rubric_part[kept], None,
                     depth=rw.depth[kept] if verifier_enabled else None, min_depth=rw.tau, zero=zero)
    sc.reward_sq.update(rw.rewards[kept].double() ** 2)
    valid = (rw.validity > 0) & rw.scored
    score_term = rw.rubric_part
    if verifier_enabled and zero == "reward":
        score_term = torch.where(rw.verified, score_term, torch.zeros_like(score_term))
    sc.mean("solver/answer_valid_rate", float(rw.validity.sum()), n)
    sc.mean("solver/reward_validity_part", float(rw.validity.sum()), n)
    sc.mean("solver/reward_score_part", float(score_term[valid].sum()), int(valid.sum()))
    sc.citations.update([(a.cited_ids, t.retrieved_ids) for a, t in zip(rw.answers, ro.solver)])
    formatted = [a for a in rw.answers if a.format_valid]  # valid but for grounding: what reward.citations=retrieved judges
    sc.mean("solver/ungrounded_citation_rate", float(sum(bool(a.ungrounded) for a in formatted)), len(formatted))
    # the groups the solver update gives no gradient: equal rewards (among the judged reports under
    # evaluator.on_incomplete=drop), or an incomplete evaluation under on_incomplete=neutral
    equal = (~informative_groups(rw, num_rollouts)).float()
    no_valid = (rw.validity.view(-1, num_rollouts).sum(dim=1) == 0).float()
    groups = equal.shape[0]
    incomplete = rw.incomplete_groups if rw.complete else torch.zeros(groups, dtype=torch.bool)
    sc.mean("solver/zero_advantage_group_rate", float(equal.sum()), groups)
    sc.mean("solver/no_valid_report_group_rate", float(no_valid.sum()), groups)
    sc.mean("evaluator/verified_rate", float(rw.verified.float().sum()), n)
    sc.mean("evaluator/process_gate_rate", float((~rw.process_ok).float().sum()) / num_rollouts, groups)
    sc.mean("evaluator/incomplete_rate", float(incomplete.float().sum()), groups)
    sc.mean("evaluator/unjudged_report_rate", float(sum(not j for j in rw.judged)), len(rw.judged))
    sc.mean("evaluator/scoring_valid_rate", float(sum(rw.eval_valid)), len(rw.eval_valid))
    sc.mean("evaluator/report_scores_valid_rate", float(sum(rw.reports_valid)), len(rw.reports_valid))
    sc.mean("evaluator/verification_depth_mean", float(sum(len(t.search_queries) for t in ro.scoring)), len(ro.scoring))
    record_discrimination(sc, rw)
    if rw.citation is not None:  # reward.citation_judge (the same on every rank): means over the reports it judged
        for key in ("f1", "precision", "recall"):
            sc.mean(f"solver/citation_judge_{key}", rw.citation[key], rw.citation["n"])


def record_discrimination(sc: StepScalars, rw: StepRewards) -> None:
    """Do the evaluator's scores separate valid reports (a(r) = 1) from invalid ones? Over judged reports whose
    scores parsed: the mean sum_j w_j s_j of each side and their difference. Scores that do not
    separate them carry no signal the validity term does not already give."""
    parsed = torch.tensor(rw.reports_valid, dtype=torch.bool) & rw.scored  # one per report (assemble_rewards)
    valid = rw.validity > 0
    for tag, side in (("evaluator/score_valid_reports", parsed & valid), ("evaluator/score_invalid_reports", parsed & ~valid)):
        sc.mean(tag, float(rw.rubric_part[side].sum()), int(side.sum()))
    sc.difference("evaluator/score_gap_valid_invalid", "evaluator/score_valid_reports", "evaluator/score_invalid_reports")


def record_ranking(sc: StepScalars, ro: StepRollouts, rw: StepRewards, num_rollouts: int, quality: str,
                   items_path: str | None = None) -> None:
    """Do the scores rank the *valid* reports of a group as the programmatic quality q(r) does (the only thing
    the score part adds to a(r))? Kendall's tau-b per group with two or more valid, parsed, untied reports,
    pooled as a mean over groups (``evaluator/rank_tau_valid``); the probe's measure, during RL."""
    import numpy as np

    from score_lightning.rewards.score_signal import group_taus
    from score_lightning.step.report_quality import step_qualities

    n = len(rw.answers)
    q = step_qualities(quality, rw.answers, ro, num_rollouts, items_path)
    valid = (rw.validity > 0) & torch.tensor(rw.reports_valid or [False] * n, dtype=torch.bool)
    if getattr(rw, "scored", None) is not None:  # judged reports only (a hand-made record may not say)
        valid = valid & rw.scored
    taus, _, _ = group_taus(rw.rubric_part.numpy(), q.numpy(), valid.numpy(), np.arange(n) // num_rollouts)
    sc.mean("evaluator/rank_tau_valid", float(sum(taus.values())), len(taus))


def record_rollouts(sc: StepScalars, ro: StepRollouts) -> None:
    """Search behaviour and lengths of the solver, and the tokens generated (for throughput)."""
    solver = ro.solver
    n = len(solver)
    sc.mean("rollout/tool_calls_mean", float(sum(t.tool_calls for t in solver)), n)
    sc.mean("rollout/response_len_mean", float(sum(len(t.response_ids) for t in solver)), n)
    sc.mean("rollout/truncated_rate", float(sum(t.truncated for t in solver)), n)
    sc.sum("rollout/invalid_actions", float(sum(t.invalid_actions for t in solver)))
    generated = sum(t.num_model_tokens for t in solver + ro.scoring) + ro.rubrics.num_tokens
    sc.sum("rollout/generated_tokens", float(generated))
    # the trajectories' solver.agent, the same on every rank
    agent = solver[0].meta.get("agent") if solver else None  # data, not config
    if agent is not None and agent in ROLLOUT_SCALARS:
        ROLLOUT_SCALARS.get(agent)(sc, solver)


def record_solver_update(sc: StepScalars, upd: SolverUpdateResult,
                         correction: RolloutCorrection = RolloutCorrection()) -> None:
    """Token means of the update's terms, pooled over every rank's response tokens; with the trainer's
    pre-update log-probs (PPO epochs, mini-batches, vLLM, a rollout correction), the engine-vs-trainer gap."""
    tokens = upd.sums["tokens"]
    for key, tag in (("pg", "solver/pg_loss"), ("kl", "solver/kl"), ("clipfrac", "solver/clipfrac"),
                     ("entropy", "solver/entropy"), ("loss", "solver/loss")):
        sc.mean(tag, upd.sums[key], tokens)
    # the value each optimiser step minimised (optim.loss_type's normaliser), averaged over the step's updates
    sc.mean("solver/objective", upd.sums.get("objective", 0.0), upd.sums.get("steps", 0.0))  # data, not config
    sc.mean("solver/advantage_abs_mean", float(upd.advantages.abs().sum()), upd.advantages.numel())
    if upd.overlong is not None:  # reward.overlong: the penalty added to the rewards GRPO normalised (<= 0)
        sc.mean("solver/overlong_penalty", float(upd.overlong.sum()), upd.overlong.numel())
        sc.mean("solver/overlong_rate", float((upd.overlong < 0).sum()), upd.overlong.numel())
    if upd.trainer_logprobs is not None:
        from score_lightning.step.rollout_correction import logprob_mismatch

        diff = logprob_mismatch(upd.rows, upd.trainer_logprobs)
        sc.mean("rollout/logprob_diff", diff or 0.0, 1.0 if diff is not None else 0.0)
    if upd.correction:  # the same keys on every rank: they follow the config (trainer log-probs, the mode)
        record_correction(sc, upd.correction, correction)


def record_correction(sc: StepScalars, sums: dict[str, float], correction: RolloutCorrection) -> None:
    """The engine-trainer gap over the trained model tokens with an engine log-prob, pooled over ranks: k3 and
    k1 estimates of KL(mu || pi_old) per token, the perplexity ratio exp(k1) = PPL(pi_old) / PPL(mu), and with a
    correction on, the mean weight and the share of tokens outside [C_min, C_max] (zeroed or clamped)."""
    n = sums["tokens"]
    sc.mean("rollout/mismatch_kl", sums["k3"], n)
    sc.mean("rollout/mismatch_k1", sums["k1"], n)
    sc.exp("rollout/ppl_ratio", "rollout/mismatch_k1")
    if correction.active:
        sc.mean("rollout/is_weight_mean", sums["weight"], n)
        sc.mean(correction.outside_tag("rollout"), sums["outside"], n)
