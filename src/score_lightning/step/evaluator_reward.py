"""Stage 5a: the evaluator's reward for its rubric, and what enters the consistency C(Gamma).

``evaluator.reward`` selects the signal REINFORCE follows (``rubric=score`` and ``rubric=evolving``):

* ``consistency`` (SCORE): R = mean over queries of C_i, the mean pairwise TF-IDF cosine of the
  conclusions of the query's *valid* reports. A query with fewer than two valid reports has no C_i;
  a step in which no query has one gives no evaluator update (and leaves the baseline alone).
* ``discriminative`` (EvoRubrics' self-supervised variant): R = mean over queries of the std of the
  rubric-weighted scores of the query's *valid* reports (a(r) > 0; queries with fewer than two have no
  value), so a rubric is rewarded for keeping the solver's usable reports apart as the solver improves,
  not for separating them from empty or broken ones, which a(r) already zeroes.
* ``preference``: R = the share of held-out preference pairs that scoring with the rubric ranks
  the right way (see :mod:`score_lightning.methods.preference.reward`), optionally mixed with an LLM
  appraisal of the rubric.
* ``solver_reward`` (the paper's "without consistency reward" ablation): R = the mean solver reward
  R_s under the rubric, the directly exploitable signal consistency replaces.

An invalid rubric (the solver used the harness fallback) is rewarded ``invalid_rubric_reward``.

**Only judged reports count.** A report no complete evaluation scored (``StepRewards.judged``: an external judge's
failed judgement, an evaluation cut before it) has no scores: its row of zeros is a failure, not a score, so the
discriminative spreads and the ``solver_reward`` means are taken over the judged reports only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from score_lightning.rewards.functions import consistency_over_valid
from score_lightning.roles.answer import AnswerParse, extract_conclusion

EVALUATOR_REWARDS = ("consistency", "discriminative", "preference", "solver_reward")


def valid_conclusion_groups(answers: Sequence[AnswerParse], num_reports: int) -> list[list[str]]:
    """Per query, the conclusions of its valid reports; only groups with at least two of them."""
    groups = []
    for start in range(0, len(answers), num_reports):
        kept = [extract_conclusion(a.answer) for a in answers[start:start + num_reports] if a.valid and a.answer]
        if len(kept) >= 2:
            groups.append(kept)
    return groups


def group_spreads(rubric_part: Tensor, valid: Sequence[bool], num_reports: int) -> list[float | None]:
    """Per query: the population std of its valid reports' rubric-weighted scores (the discriminative reward);
    ``None`` for a query with fewer than two valid reports."""
    out: list[float | None] = []
    for row, ok in zip(rubric_part.view(-1, num_reports).float(), [valid[i:i + num_reports]
                                                                  for i in range(0, len(valid), num_reports)]):
        kept = row[[bool(v) for v in ok]]
        out.append(kept.std(unbiased=False).item() if kept.numel() >= 2 else None)
    return out


def judged_reports(rw) -> list[bool]:
    """Per report: a complete evaluation scored it (every report when the step has no such record)."""
    return [bool(j) for j in (getattr(rw, "judged", None) or [True] * len(rw.answers))]


def spread_mask(answers: Sequence[AnswerParse], judged: Sequence[bool] | None = None) -> list[bool]:
    """The reports a discriminative spread reads: valid (a(r) > 0, an answer) and judged."""
    judged = judged if judged is not None else [True] * len(answers)
    return [bool(a.valid and a.answer and j) for a, j in zip(answers, judged)]


def judged_reward_means(rewards: Tensor, judged: Sequence[bool], num_reports: int) -> list[float | None]:
    """Per query: the mean solver reward of its judged reports (``None``: none was judged)."""
    out: list[float | None] = []
    for row, ok in zip(rewards.view(-1, num_reports).float(), torch.tensor(list(judged)).view(-1, num_reports)):
        out.append(row[ok].mean().item() if bool(ok.any()) else None)
    return out


def per_query_values(kind: str, answers: Sequence[AnswerParse], rubric_part: Tensor, rewards: Tensor,
                     num_reports: int, judged: Sequence[bool] | None = None) -> list[float | None]:
    """This rank's per-query evaluator reward (``None``: undefined), for rubrics that belong to one query; the
    score-based kinds read only the ``judged`` reports (module docstring)."""
    if kind == "consistency":
        out = []
        for start in range(0, len(answers), num_reports):
            group = answers[start:start + num_reports]
            out.append(consistency_over_valid([extract_conclusion(a.answer or "") for a in group],
                                              [bool(a.valid and a.answer) for a in group]))
        return out
    if kind == "discriminative":
        return group_spreads(rubric_part, spread_mask(answers, judged), num_reports)
    if kind == "solver_reward":
        return judged_reward_means(rewards, judged if judged is not None else [True] * len(answers), num_reports)
    return [None] * (len(answers) // num_reports)  # preference: a global value only


def evaluator_reward(kind: str, rubric_valid: bool, value: float, invalid_rubric_reward: float) -> float | None:
    """A rubric's R_eval from its mode's value (NaN: undefined), or ``None`` when there is no signal."""
    if kind not in EVALUATOR_REWARDS:
        raise ValueError(f"evaluator.reward={kind!r}: allowed {EVALUATOR_REWARDS}")
    if not rubric_valid:
        return float(invalid_rubric_reward)
    return None if value is None or math.isnan(value) else float(value)
