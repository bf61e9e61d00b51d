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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from score_lightning.harness.state import HarnessState, ProcessConstraints
from score_lightning.rewards.functions import rewards_from_parts
from score_lightning.roles.answer import AnswerParse, parse_answer
from score_lightning.roles.evaluation import EvaluationParse, parse_evaluation
from score_lightning.roles.rubric import Rubric
from score_lightning.rollout.trajectory import Trajectory


@dataclass(frozen=True)
class RewardSettings:
    """``reward.*`` and ``verifier.*`` from the config."""

    require_citation: bool
    min_answer_chars: int
    verifier_enabled: bool
    min_search_depth: int
    zero: str = "reward"
    tau_from_harness: bool = False  # verifier.tau_from_harness

    @classmethod
    def from_cfg(cls, cfg) -> "RewardSettings":
        return cls(bool(cfg.reward.require_citation), int(cfg.reward.min_answer_chars), bool(cfg.verifier.enabled),
                   int(cfg.verifier.min_search_depth), str(cfg.verifier.get("zero", "reward")),
                   bool(cfg.verifier.get("tau_from_harness", False)))


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
    eval_valid: list[bool]  # per query: the scoring XML parsed completely
    rewards: Tensor  # [N] s_i^k, what GRPO normalises
    tau: int
    reports_valid: list[bool] = field(default_factory=list)  # per report: its scores parsed completely (what feeds R_s)


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


def meets_process_rules(ev: EvaluationParse, num_reports: int, pc: ProcessConstraints) -> bool:
    """Every report 1..K has the sections the harness requires (always true when none is required)."""
    if not (pc.require_verification or pc.require_gap_analysis):
        return True
    for rid in range(1, num_reports + 1):
        rep = ev.reports.get(rid)
        if rep is None:
            return False
        if pc.require_verification and not rep.has_verification:
            return False
        if pc.require_gap_analysis and not rep.has_gap_analysis:
            return False
    return True


def parse_answers(solver: Sequence[Trajectory], tokenizer, settings: RewardSettings) -> list[AnswerParse]:
    """a(r) and the report text of every solver trajectory (judged on model-written tokens only)."""
    return [parse_answer(t.model_text(tokenizer), t.truncated, require_citation=settings.require_citation,
                         min_chars=settings.min_answer_chars) for t in solver]


def assemble_rewards(
    answers: Sequence[AnswerParse], scoring: Sequence[Trajectory], rubrics: Sequence[Rubric], state: HarnessState,
    num_reports: int, settings: RewardSettings, tokenizer,
) -> StepRewards:
    """Parse each query's evaluation under that query's rubric and combine validity, scores, gates and the verifier."""
    pc = state.process_constraints
    matrices: list[Tensor] = []
    depth: list[int] = []
    process_ok: list[bool] = []
    eval_valid: list[bool] = []
    reports_valid: list[bool] = []
    for st, rubric in zip(scoring, rubrics):
        ev = parse_evaluation(st.model_text(tokenizer), rubric, num_reports, require_verification=pc.require_verification,
                              require_gap_analysis=pc.require_gap_analysis)
        ok = meets_process_rules(ev, num_reports, pc)
        matrix = torch.tensor(ev.score_matrix(rubric, num_reports), dtype=torch.float32).reshape(num_reports, -1)
        matrices.append(matrix if ok else torch.zeros_like(matrix))
        depth.extend([len(st.search_queries)] * num_reports)
        process_ok.extend([ok] * num_reports)
        eval_valid.append(ev.valid)
        reports_valid.extend(ev.reports.get(rid) is not None and ev.reports[rid].valid for rid in range(1, num_reports + 1))
    out = combine(answers, matrices, rubrics, depth, process_ok, eval_valid,
                  effective_tau(settings.min_search_depth, state, settings.tau_from_harness), settings)
    out.reports_valid = reports_valid
    return out


def combine(
    answers: Sequence[AnswerParse], matrices: Sequence[Tensor], rubrics: Sequence[Rubric], depth: Sequence[int],
    process_ok: Sequence[bool], eval_valid: list[bool], tau: int, settings: RewardSettings,
) -> StepRewards:
    """The tensor arithmetic of :func:`assemble_rewards`, on already-parsed inputs (one matrix per query)."""
    validity = torch.tensor([float(a.valid) for a in answers], dtype=torch.float32)
    parts = torch.cat([rubric_part(m, r) for m, r in zip(matrices, rubrics)]) if matrices else validity.new_zeros(0)
    depth_t = torch.tensor(list(depth), dtype=torch.long)
    rewards, parts, verified = rewards_from_parts(validity, parts, depth_t, tau, settings.verifier_enabled, settings.zero)
    return StepRewards(list(answers), validity, list(matrices), parts, depth_t, verified,
                       torch.tensor(list(process_ok), dtype=torch.bool), eval_valid, rewards, tau)
