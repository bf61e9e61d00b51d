"""q(r), a report's programmatic quality (``reward.rule_quality``, :mod:`score_lightning.rewards.rule`), for every
report of a step: the rule reward's (``methods/rule/``) and the yardstick the evaluator's scores are ranked against
(``evaluator/score_quality_*``, the scoring reward)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from score_lightning.data.items import cached_items
from score_lightning.rewards.rule import qualities
from score_lightning.roles.answer import AnswerParse
from score_lightning.step.types import StepRollouts


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
