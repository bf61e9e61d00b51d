"""Beyond the paper: REINFORCE on the evaluator's *scoring* tokens, rewarded by a verifiable pairwise order.

SCORE trains only the tokens that wrote the rubric; the scores themselves never learn to rank. With
``evaluator.scoring_reward=pairwise_recall`` (off by default: ``none``), every scoring evaluation of the step
also joins the evaluator's one REINFORCE update, rewarded by whether its scores order the query's reports as
their verifiable quality does, as judge-training work with verifiable rewards teaches ranking.

**Quality.** q_i = ``item_recall`` of report i over its query's evidence items (``reward.items_path``, the
embedded items by default), and 0 for a report that is not valid (a(r) = 0): the order the card's quality
metric and ``scripts/bench_evaluator.py``'s valid pairs use.

**Scores.** S_i = sum_j w_j s_j, the rubric part the solver's reward read (``StepRewards.rubric_part``). A report
is *scored* when a complete evaluation judged it and its scores parsed.

**Pairs and outcomes.** A pair (i, j) of one query is *informative* when both are scored and q_i != q_j. Its
outcome is o_ij = 1 when (S_i - S_j)(q_i - q_j) > 0, 1/2 when S_i = S_j (a tie orders nothing), 0 otherwise.

**Reward per evaluation.** An evaluation that scored the reports R_e (``pointwise``: its one report; ``joint``: the
query's K) earns R_e = the mean of o_ij over the informative pairs with i or j in R_e; with none it has no reward
and leaves the update. Its tokens train (every model token; observations are masked, as in the solver's rows).

**Advantage.** A_e = R_e - b_{t-1}, with its own EMA baseline (beta = ``evaluator.ema_beta``, pooled over ranks,
checkpointed). Folded into the rubric's REINFORCE so that the loss is the mean over rubric samples plus the mean
over scoring samples (plus the step judgements', when ``reward.step=rubric``), on the update schedule of
``evaluator.update_every``.

Under constrained scoring the grammar forces the tags; their tokens train too, with an advantage the forcing
makes uncorrelated with them, so they add variance, not a direction. Under ``score_readout=expected`` the order
is read from the expected values, while the gradient follows the sampled value tokens that share their
distribution.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from score_lightning.rewards.functions import EMABaseline
from score_lightning.step.evaluator_objective import EvaluatorObjective, StepView
from score_lightning.step.evaluator_phase import centre, fold_rows

if TYPE_CHECKING:
    from score_lightning.config.schema import EvaluatorConfig, RewardConfig

SCORING_REWARDS = ("none", "pairwise_recall")


def pair_outcome(s_i: float, s_j: float, q_i: float, q_j: float) -> float:
    """o_ij of the module docstring, for an informative pair (q_i != q_j)."""
    if s_i == s_j:
        return 0.5
    return 1.0 if (s_i - s_j) * (q_i - q_j) > 0 else 0.0


def evaluation_rewards(scores: Sequence[float], quality: Sequence[float], scored: Sequence[bool],
                       num_reports: int, pointwise: bool) -> list[float | None]:
    """R_e of every evaluation (query-major; K per query pointwise, one per query joint); ``None``: no informative
    pair. ``scores``, ``quality`` and ``scored`` are per report, query-major (rows of K)."""
    if not len(scores) == len(quality) == len(scored):
        raise ValueError(f"scores ({len(scores)}), quality ({len(quality)}) and scored ({len(scored)}) differ in length")
    if num_reports < 1 or len(scores) % num_reports:
        raise ValueError(f"{len(scores)} reports do not split into queries of {num_reports}")
    out: list[float | None] = []
    for g in range(0, len(scores), num_reports):
        idx = range(g, g + num_reports)
        pairs = [(i, j, pair_outcome(scores[i], scores[j], quality[i], quality[j]))
                 for i in idx for j in idx if i < j and scored[i] and scored[j] and quality[i] != quality[j]]
        groups = [{i} for i in idx] if pointwise else [set(idx)]
        for reports in groups:
            mine = [o for i, j, o in pairs if i in reports or j in reports]
            out.append(sum(mine) / len(mine) if mine else None)
    return out


@dataclass
class ScoringSample:
    """One scoring evaluation's tokens, trained by REINFORCE like a rubric sample (same three fields)."""

    prompt_ids: list[int]
    response_ids: list[int]
    train_mask: list[int]
    engine_logprobs: list[float] | None = None  # the engine's log-prob of each response token (rollout_correction)


@dataclass
class ScoringJudgement:
    """This rank's scoring samples with their rewards; empty when ``evaluator.scoring_reward=none``."""

    enabled: bool = False
    samples: list[ScoringSample] = field(default_factory=list)
    rewards: list[float | None] = field(default_factory=list)  # per evaluation
    advantages: list[float] = field(default_factory=list)  # per evaluation with a reward, EMA-centred
    has_signal: bool = False  # some rank has a reward (the same on every rank)

    def fold(self, trained: list | None, advantages: list[float]) -> tuple[list | None, list[float]]:
        """Join the scoring samples to the update's samples (``trained``: ``None`` when nothing else trains).

        ``trained`` may already hold several parts, scaled so that REINFORCE's mean over its rows is the sum of
        their means; rescaling it by N / len(trained) and the scoring part by N / len(scoring) keeps that true.
        """
        if not self.enabled or (trained is None and not self.has_signal):
            return trained, advantages
        return fold_rows(trained or [], advantages if trained is not None else [],
                         [s for s, r in zip(self.samples, self.rewards) if r is not None], self.advantages)


class ScoringRewardStage(EvaluatorObjective):
    """The evaluator objective of ``evaluator.scoring_reward``: reads the step's scoring evaluations against the
    reports' ``item_recall``, keeps the baseline, and folds the rewarded evaluations into the update."""

    def __init__(self, mode: str, ema_beta: float, items_path: str | None = None):
        if mode not in SCORING_REWARDS:
            raise ValueError(f"evaluator.scoring_reward={mode!r}: allowed {SCORING_REWARDS}")
        self.mode, self.items_path = mode, items_path
        self.baseline = EMABaseline(ema_beta)
        self.judgement = ScoringJudgement()  # the step's, once judged (the step records it)

    def judge(self, step: StepView) -> None:
        """Rewards and advantages of this rank's evaluations, kept as the step's :class:`ScoringJudgement` (empty
        when ``evaluator.scoring_reward=none``); collective when on: the baseline is pooled. No token bonus."""
        self.judgement = self._judgement(step.rollouts, step.rewards, step.num_reports, step.scalars)

    def fold(self, trained: list | None, advantages: list[float]) -> tuple[list | None, list[float]]:
        return self.judgement.fold(trained, advantages)

    def _judgement(self, ro, rw, num_reports: int, sc) -> ScoringJudgement:
        if self.mode == "none":
            return ScoringJudgement()
        from score_lightning.step.report_quality import step_qualities

        recall = step_qualities("item_recall", rw.answers, ro, num_reports, self.items_path)
        quality = (recall * (rw.validity > 0).to(recall.dtype)).tolist()
        n = len(rw.answers)
        scored = [bool(j and v) for j, v in zip(rw.judged or [True] * n, rw.reports_valid or [False] * n)]
        pointwise = len(ro.scoring) == n
        rewards = evaluation_rewards(rw.rubric_part.tolist(), quality, scored, num_reports, pointwise)
        out = ScoringJudgement(enabled=True, rewards=rewards, samples=[
            ScoringSample(list(t.prompt_ids), list(t.response_ids), list(t.response_mask),
                          list(t.engine_logprobs) if t.engine_logprobs else None) for t in ro.scoring])
        out.advantages, mean, _ = centre(rewards, self.baseline)
        out.has_signal = mean is not None
        defined = [r for r in rewards if r is not None]
        sc.mean("evaluator/scoring_pair_acc", sum(defined), len(defined))
        sc.mean("evaluator/scoring_rewarded_rate", float(len(defined)), len(rewards))
        sc.mean("evaluator/scoring_baseline", self.baseline.value, 1.0)
        return out

    def state_dict(self) -> dict:
        """Splatted into the checkpoint's ``score`` section."""
        return {"scoring_baseline": self.baseline.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("scoring_baseline") is not None:
            self.baseline.load_state_dict(state["scoring_baseline"])


def scoring_reward_stage(evaluator: "EvaluatorConfig", reward: "RewardConfig") -> ScoringRewardStage:
    """``evaluator.scoring_reward`` with its baseline's ``evaluator.ema_beta``, over ``reward.items_path``'s items."""
    items = reward.items_path
    return ScoringRewardStage(str(evaluator.scoring_reward), float(evaluator.ema_beta),
                              None if items is None else str(items))

