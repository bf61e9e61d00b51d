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

from torch import Tensor

from score_lightning.items.format import cached_items
from score_lightning.rewards.rule import qualities, rule_rewards
from score_lightning.roles.answer import AnswerParse
from score_lightning.step.reward_assembly import StepRewards
from score_lightning.step.types import StepRollouts

SOURCES = ("evaluator", "rule")


def step_qualities(kind: str, answers: Sequence[AnswerParse], ro: StepRollouts, num_reports: int,
                   items_path: str | None = None) -> Tensor:
    """q(r) of every report of the step (query-major rows), read as ``reward.rule_quality=kind`` reads it:
    the rule reward and the evaluator's ranking scalar both call this one function."""
    n = len(answers)
    tops = [[d.id for d in ro.evidence[i // num_reports]] if ro.evidence else [] for i in range(n)]
    items = reports = None
    if kind == "item_recall":
        table = cached_items(items_path)
        missing = sorted({str(q) for q in ro.query_ids} - set(table))
        if missing or not ro.query_ids:
            raise ValueError(f"reward.rule_quality=item_recall: no items for queries {missing[:5] or '(no ids)'} in "
                             f"{items_path or 'the embedded items file'}; build them with scripts/build_rubrics.py "
                             "and set reward.items_path")
        items = [table[str(ro.query_ids[i // num_reports])].items for i in range(n)]
        reports = [a.answer or "" for a in answers]
    return qualities(kind, [a.cited_ids for a in answers], [t.retrieved_ids for t in ro.solver], tops, reports, items)


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
