"""Stage 5a: the evaluator's reward for its rubric, and what enters the consistency C(Gamma).

``evaluator.reward`` selects the signal REINFORCE follows:

* ``consistency`` (SCORE): R_eval = mean over queries of C_i, the mean pairwise TF-IDF cosine of
  the conclusions of the query's *valid* reports. A query with fewer than two valid reports has no
  C_i; a step in which no query has one gives no evaluator update (and leaves the baseline alone).
* ``solver_reward`` (the paper's "without consistency reward" ablation): R_eval = the mean solver
  reward R_s under the rubric, the directly exploitable signal consistency replaces.

An invalid rubric (the solver used the harness fallback) is rewarded ``invalid_rubric_reward``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from score_lightning.roles.answer import AnswerParse, extract_conclusion

EVALUATOR_REWARDS = ("consistency", "solver_reward")


def valid_conclusion_groups(answers: Sequence[AnswerParse], num_reports: int) -> list[list[str]]:
    """Per query, the conclusions of its valid reports; only groups with at least two of them."""
    groups = []
    for start in range(0, len(answers), num_reports):
        kept = [extract_conclusion(a.answer) for a in answers[start:start + num_reports] if a.valid and a.answer]
        if len(kept) >= 2:
            groups.append(kept)
    return groups


def evaluator_reward(kind: str, rubric_valid: bool, consistency: float, mean_solver_reward: float,
                     invalid_rubric_reward: float) -> float | None:
    """The step's R_eval, or ``None`` when the step carries no evaluator signal.

    ``consistency`` and ``mean_solver_reward`` are global (pooled over ranks); NaN means undefined.
    """
    if kind not in EVALUATOR_REWARDS:
        raise ValueError(f"evaluator.reward={kind!r}: allowed {EVALUATOR_REWARDS}")
    if not rubric_valid:
        return float(invalid_rubric_reward)
    value = consistency if kind == "consistency" else mean_solver_reward
    return None if math.isnan(value) else float(value)
