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

from score_lightning.rewards.rule import rule_rewards
from score_lightning.roles.answer import AnswerParse
from score_lightning.step.report_quality import step_qualities
from score_lightning.step.reward_assembly import StepRewards
from score_lightning.step.scoring_sources import REWARD_SOURCES, ScoringSource
from score_lightning.step.types import StepRollouts


def rule_step_rewards(answers: Sequence[AnswerParse], ro: StepRollouts, num_reports: int, quality: str,
                      items_path: str | None = None) -> StepRewards:
    """The step's rewards under ``reward.source=rule`` with ``reward.rule_quality=quality``."""
    n = len(answers)
    validity = torch.tensor([float(a.valid) for a in answers], dtype=torch.float32)
    q = step_qualities(quality, answers, ro, num_reports, items_path)
    rewards = rule_rewards(validity, q)
    queries = n // num_reports
    return StepRewards(
        answers=list(answers), validity=validity, item_scores=[torch.zeros(num_reports, 0)] * queries,
        rubric_part=torch.where(validity > 0, q, torch.zeros_like(q)), depth=torch.zeros(n, dtype=torch.long),
        verified=torch.ones(n, dtype=torch.bool), process_ok=torch.ones(n, dtype=torch.bool), eval_valid=[],
        rewards=rewards, tau=0, reports_valid=[False] * n, complete=[True] * queries, judged=[True] * n)


def _rule_source(gen, ro: StepRollouts, answers: Sequence[AnswerParse]) -> StepRewards:
    ro.scoring = []  # no evaluator runs
    gen.release_caches()
    reward = gen.cfg.reward
    return rule_step_rewards(answers, ro, gen.K, str(reward.rule_quality),
                             None if reward.items_path is None else str(reward.items_path))


REWARD_SOURCES.register("rule", ScoringSource(_rule_source))
