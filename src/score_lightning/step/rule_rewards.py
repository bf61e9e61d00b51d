"""Stage 3 with ``reward.source=rule``: the known-good reward instead of the evaluator's scores.

R = a(r) · (1 + q(r)) (:mod:`score_lightning.rewards.rule`), from the trajectory and the corpus alone:
no scoring rollouts run, so nothing here depends on the evaluator, the verifier or the process gates.
The result is a :class:`~score_lightning.step.reward_assembly.StepRewards` like the evaluator's, so the
solver update, the logs and the collapse guard read it unchanged; ``rubric_part`` holds q(r), the part
that plays the score's role (``solver/reward_score_part``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from score_lightning.rewards.rule import qualities, rule_rewards
from score_lightning.roles.answer import AnswerParse
from score_lightning.step.reward_assembly import StepRewards
from score_lightning.step.types import StepRollouts

SOURCES = ("evaluator", "rule")


def rule_step_rewards(answers: Sequence[AnswerParse], ro: StepRollouts, num_reports: int, quality: str) -> StepRewards:
    """The step's rewards under ``reward.source=rule`` with ``reward.rule_quality=quality``."""
    n = len(answers)
    validity = torch.tensor([float(a.valid) for a in answers], dtype=torch.float32)
    tops = [[d.id for d in ro.evidence[i // num_reports]] if ro.evidence else [] for i in range(n)]
    q = qualities(quality, [a.cited_ids for a in answers], [t.retrieved_ids for t in ro.solver], tops)
    rewards = rule_rewards(validity, q)
    queries = n // num_reports
    return StepRewards(
        answers=list(answers), validity=validity, item_scores=[torch.zeros(num_reports, 0)] * queries,
        rubric_part=torch.where(validity > 0, q, torch.zeros_like(q)), depth=torch.zeros(n, dtype=torch.long),
        verified=torch.ones(n, dtype=torch.bool), process_ok=torch.ones(n, dtype=torch.bool), eval_valid=[],
        rewards=rewards, tau=0, reports_valid=[False] * n, complete=[True] * queries, judged=[True] * n)
