"""Stage 3: from parsed reports and evaluations to the solver rewards s_i^k (pure functions).

R_s(r) = a(r) * (1 + sum_j w_j s_j(r)), with two gates that make the harness constraints bind:

* **process gate**: when an evaluation breaks a process rule of the harness (``require_verification``
  or ``require_gap_analysis``: some report lacks its ``<verification>`` / ``<gap_analysis>``
  section), every score of that evaluation is 0. The whole evaluation is gated, not the one report:
  the evaluator skipped the required work, so none of its scores is trusted, and the solver's
  group advantages do not inherit a difference the solver did not cause.
* **reward verifier** (Algorithm 1, line 23): a report whose evaluation searched fewer than
  tau_s = ``verifier.min_search_depth`` times gets reward 0 (``verifier.zero=reward``, the default)
  or scores 0 (``verifier.zero=scores``). tau_s is fixed, as in the paper; the harness's
  ``min_number_of_tool_call`` is a prompt rule. ``verifier.tau_from_harness=true`` couples them
  (tau_s = the larger of the two), which can ratchet: see :func:`effective_tau`.

Either scoring protocol (``evaluator.scoring``) arrives as one :class:`GroupEvaluation` per query
(:mod:`~score_lightning.step.evaluations`): under ``joint`` the gate covers the query's one evaluation,
under ``pointwise`` each report's own.

**An incomplete evaluation costs only what it does not know** (``evaluator.on_incomplete``). A report
is *unjudged* when no complete evaluation scored it: under ``joint`` every report of a group whose one
evaluation was cut or ended early, under ``pointwise`` only the report whose own evaluation was.

* ``validity`` (default): an unjudged report's reward is R = a(r), which was measured without the
  evaluator; its score part is 0 and the verifier (which checks the evaluation's searches) does not
  apply to it. Every row trains and counts in the token-mean denominator.
* ``drop``: unjudged reports leave the update; their group's advantages are normalised over the judged
  ones, and their tokens count nowhere (not in the loss, not in the denominator).
* ``neutral`` (the rule before): every report of a group with an incomplete evaluation gets advantage 0;
  the rows stay in the loss (their tokens count in the denominator and feel the KL).

Validity a(r) follows ``reward.citations``: ``any`` (the paper's rule: any bracketed id counts) or
``retrieved`` (at least one citation, and every cited id among those the trajectory's searches returned).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from score_lightning.harness.state import HarnessState
from score_lightning.rewards.functions import rewards_from_parts
from score_lightning.roles.answer import AnswerParse, parse_answer
from score_lightning.roles.rubric import Rubric
from score_lightning.rollout.trajectory import Trajectory
from score_lightning.step.evaluations import GroupEvaluation, group_evaluations, meets_process_rules  # noqa: F401

if TYPE_CHECKING:
    from score_lightning.config.schema import EvaluatorConfig, RewardConfig, VerifierConfig

CITATION_RULES = ("any", "retrieved")
ON_INCOMPLETE = ("validity", "drop", "neutral")


@dataclass
class StepRewards:
    """Everything the updates and the logs need about one step's rewards (this rank's rows)."""

    answers: list[AnswerParse]
    validity: Tensor  # [N] a(r)
    item_scores: list[Tensor]  # per query [K, k_q]: the evaluator's scores as used (after the process gate)
    rubric_part: Tensor  # [N] sum_j w_j s_j as it entered the reward (0 where the verifier zeroed scores)
    depth: Tensor  # [N] verification searches behind each report's scores
    verified: Tensor  # [N] bool, depth >= tau
    process_ok: Tensor  # [N] bool, the report's evaluation met the process rules
    eval_valid: list[bool]  # per evaluation (one per query joint, one per report pointwise): its XML parsed completely
    rewards: Tensor  # [N] s_i^k, what GRPO normalises
    tau: int
    reports_valid: list[bool] = field(default_factory=list)  # per report: its scores parsed completely (what feeds R_s)
    complete: list[bool] = field(default_factory=list)  # per query: every evaluation reached every report
    judged: list[bool] = field(default_factory=list)  # per report: a complete evaluation scored it
    on_incomplete: str = "validity"  # what an unjudged report costs (module docstring)
    judge: object = None  # JudgeTally of the step's external judgements (clients/judge.py), else None
    dropped: list[bool] = field(default_factory=list)  # per report: a failed citation judgement leaves it out
    citation: dict | None = None  # reward.citation_judge: sums of precision, recall, F1 and the reports judged

    @property
    def incomplete_groups(self) -> Tensor:
        """[B] bool: queries with at least one incomplete evaluation."""
        return torch.tensor([not c for c in self.complete], dtype=torch.bool)

    @property
    def neutral(self) -> Tensor:
        """[N] bool (``on_incomplete=neutral``): reports of groups with an incomplete evaluation; advantage 0."""
        if not self.complete or self.on_incomplete != "neutral":
            return torch.zeros(len(self.answers), dtype=torch.bool)
        k = len(self.answers) // len(self.complete)
        return self.incomplete_groups.repeat_interleave(k)

    @property
    def scored(self) -> Tensor:
        """[N] bool: reports a complete evaluation scored (``judged``). Every consumer of scores reads only these:
        RLER's spreads and contrast, the discriminative spreads, ``solver_reward``, the score logs."""
        if not self.judged:
            return torch.ones(len(self.answers), dtype=torch.bool)
        return torch.tensor(self.judged, dtype=torch.bool)

    @property
    def rewarded(self) -> Tensor:
        """[N] bool: reports whose reward was measured, what the reward logs pool: the scored ones and, under
        ``on_incomplete=validity``, the unjudged ones too (R = a(r), measured without the evaluator); under
        ``drop`` and ``neutral`` an unjudged report's R holds zeros for its scores, and it is left out."""
        out = self.scored | (self.on_incomplete == "validity")
        if self.dropped:  # a failed citation judgement: no reward at all
            out = out & ~torch.tensor(self.dropped, dtype=torch.bool)
        return out

    @property
    def excluded(self) -> Tensor:
        """[N] bool: reports that leave the solver update: unjudged ones under ``on_incomplete=drop`` (an
        external judge's failures among them), and those whose citation judgement failed."""
        out = torch.zeros(len(self.answers), dtype=torch.bool)
        if self.judged and self.on_incomplete == "drop":
            out = ~torch.tensor(self.judged, dtype=torch.bool)
        if self.dropped:
            out = out | torch.tensor(self.dropped, dtype=torch.bool)
        return out


def rubric_part(scores: Tensor, rubric: Rubric) -> Tensor:
    """sum_j w_j s_j per report ``[K]``; binary items count as met (1) or not (0), and a rubric with
    "penalise this" items (negative weights) is clipped to [0, 1]."""
    if rubric.binary:
        scores = (scores >= 0.5).to(scores.dtype)
    part = (scores * torch.tensor(rubric.weights, dtype=scores.dtype)).sum(dim=-1)
    return part.clamp(0.0, 1.0) if any(w < 0 for w in rubric.weights) else part


def effective_tau(min_search_depth: int, state: HarnessState, from_harness: bool = False) -> int:
    """tau_s: ``verifier.min_search_depth``, fixed (the paper's verifier).

    ``from_harness`` (``verifier.tau_from_harness``): the larger of that and the harness's
    ``min_number_of_tool_call``. Off by default because it can ratchet: the rule harness raises its
    minimum while ``verified_rate`` is low, a higher tau_s lowers ``verified_rate`` further, and
    nothing trains the evaluator to search more (scoring tokens are never trained).
    """
    if not from_harness:
        return int(min_search_depth)
    return max(int(min_search_depth), int(state.process_constraints.min_number_of_tool_call))


def verifier_tau(verifier: "VerifierConfig", state: HarnessState) -> int:
    """tau_s of this step: :func:`effective_tau` of ``verifier.min_search_depth`` and ``verifier.tau_from_harness``."""
    return effective_tau(int(verifier.min_search_depth), state, bool(verifier.tau_from_harness))


def parse_answers(solver: Sequence[Trajectory], tokenizer, reward: "RewardConfig") -> list[AnswerParse]:
    """a(r) and the report text of every solver trajectory (judged on model-written tokens only), under ``reward``'s
    validity rules (``require_citation``, ``min_answer_chars``, ``citations``)."""
    grounded = str(reward.citations) == "retrieved"
    return [parse_answer(t.model_text(tokenizer), t.truncated, require_citation=bool(reward.require_citation),
                         min_chars=int(reward.min_answer_chars), retrieved=t.retrieved_ids, require_grounded=grounded)
            for t in solver]


def assemble_rewards(
    answers: Sequence[AnswerParse], scoring: Sequence[Trajectory], rubrics: Sequence[Rubric], state: HarnessState,
    num_reports: int, evaluator: "EvaluatorConfig", verifier: "VerifierConfig", tokenizer,
) -> StepRewards:
    """Parse each query's evaluation(s) under that query's rubric (``evaluator.scoring``, ``evaluator.score_readout``)
    and combine validity, scores, gates and the verifier."""
    groups = group_evaluations(scoring, rubrics, num_reports, str(evaluator.scoring), state.process_constraints,
                               tokenizer, str(evaluator.score_readout))
    return rewards_from_evaluations(answers, groups, rubrics, num_reports, verifier_tau(verifier, state), verifier,
                                    str(evaluator.on_incomplete))


def rewards_from_evaluations(answers: Sequence[AnswerParse], groups: Sequence[GroupEvaluation],
                             rubrics: Sequence[Rubric], num_reports: int, tau: int, verifier: "VerifierConfig",
                             unjudged: str) -> StepRewards:
    """The process gate per evaluation, then :func:`combine`; pure, so tests can feed hand-made evaluations.
    ``unjudged``: what an unjudged report costs (``evaluator.on_incomplete``; an external judge's failed judgement is
    never a score, so ``methods/judge/`` passes ``drop``)."""
    matrices: list[Tensor] = []
    for g, rubric in zip(groups, rubrics):
        matrix = torch.tensor(g.parse.score_matrix(rubric, num_reports), dtype=torch.float32).reshape(num_reports, -1)
        ok = torch.tensor(g.process_ok, dtype=torch.bool).unsqueeze(-1)
        matrices.append(torch.where(ok, matrix, torch.zeros_like(matrix)))
    out = combine(answers, matrices, rubrics, [d for g in groups for d in g.depth],
                  [ok for g in groups for ok in g.process_ok], [v for g in groups for v in g.evaluations_valid], tau,
                  verifier)
    out.reports_valid = [g.report_valid(rid) for g in groups for rid in range(1, num_reports + 1)]
    out.complete = [g.complete for g in groups]
    out.judged = [j for g in groups for j in (g.judged or (g.complete,) * num_reports)]
    out.on_incomplete = unjudged
    if unjudged == "validity":
        judged = torch.tensor(out.judged, dtype=torch.bool)
        out.rewards = torch.where(judged, out.rewards, out.validity)
        out.rubric_part = torch.where(judged, out.rubric_part, torch.zeros_like(out.rubric_part))
    return out


def combine(
    answers: Sequence[AnswerParse], matrices: Sequence[Tensor], rubrics: Sequence[Rubric], depth: Sequence[int],
    process_ok: Sequence[bool], eval_valid: list[bool], tau: int, verifier: "VerifierConfig",
) -> StepRewards:
    """The tensor arithmetic of :func:`assemble_rewards`, on already-parsed inputs (one matrix per query), under
    ``verifier.enabled`` and ``verifier.zero``."""
    validity = torch.tensor([float(a.valid) for a in answers], dtype=torch.float32)
    parts = torch.cat([rubric_part(m, r) for m, r in zip(matrices, rubrics)]) if matrices else validity.new_zeros(0)
    depth_t = torch.tensor(list(depth), dtype=torch.long)
    rewards, parts, verified = rewards_from_parts(validity, parts, depth_t, tau, bool(verifier.enabled),
                                                  str(verifier.zero))
    return StepRewards(list(answers), validity, list(matrices), parts, depth_t, verified,
                       torch.tensor(list(process_ok), dtype=torch.bool), eval_valid, rewards, tau)
