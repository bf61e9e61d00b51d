"""The rubric-source interface and what it hands to a step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from score_lightning.harness.scheduler import DimensionScheduler
from score_lightning.harness.state import HarnessState
from score_lightning.retrieval.base import Retriever
from score_lightning.roles.evidence import EvidenceDoc
from score_lightning.rollout.engine import RolloutEngine
from score_lightning.step.types import StepRubric


@dataclass
class RubricContext:
    """What a rubric source may use to build or update rubrics (rank-local)."""

    engine: RolloutEngine  # the evaluator role's engine
    tokenizer: Any
    retriever: Retriever
    state: HarnessState
    scheduler: DimensionScheduler
    max_prompt_tokens: int  # evaluator.max_prompt_tokens: the rubric prompt is the evaluator's
    temperature: float
    step: int = 0  # the SCORE step the rubrics are for (DR-rubric's bootstrap iterations read it)


class RubricSource(Protocol):
    """Builds each step's rubrics; may learn from the step's scores (``observe``); checkpointed."""

    #: the evaluator's rubric tokens are trained by REINFORCE (false: the rubrics are fixed)
    trains_evaluator: bool

    def step_rubrics(self, ctx: RubricContext, queries: Sequence[str], query_ids: Sequence[str],
                     evidence: Sequence[Sequence[EvidenceDoc]]) -> StepRubric: ...

    def observe(self, ctx: RubricContext, queries: Sequence[str], query_ids: Sequence[str],
                item_scores: Sequence[Any], reports: Sequence[Sequence[str | None]],
                rewards: Sequence[Sequence[float]],
                passages: Callable[[], list[list[dict[str, str]]]] | None = None) -> dict[str, float]:
        """``passages()`` (computed only when called): per query, per report, what its searches showed it by id."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...
