"""``rubric=score``: SCORE's rubric, sampled by the evaluator from the harness pool once per step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from score_lightning.roles.evidence import EvidenceDoc
from score_lightning.roles.rubric import WEIGHT_SUM_TOL
from score_lightning.step.rubric_source import RubricContext
from score_lightning.step.types import StepRubric
from score_lightning.step.rubric_stage import RubricSampling, sample_step_rubric


@dataclass
class ScoreRubrics:
    """One rubric Gamma_t = (H_t, w_t) for the global batch (rank 0 samples, every rank receives it)."""

    max_tokens: int = 96
    max_queries: int = 8  # queries of the global batch listed (with evidence ids) in the rubric prompt
    static: bool = False  # never sample: always the harness fallback rubric (the plain GRPO baseline)
    weight_sum_tol: float | None = WEIGHT_SUM_TOL  # |sum of weights - 1| allowed; None: normalised, not checked
    trains_evaluator: bool = True

    def step_rubrics(self, ctx: RubricContext, queries: Sequence[str], query_ids: Sequence[str],
                     evidence: Sequence[Sequence[EvidenceDoc]]) -> StepRubric:
        settings = RubricSampling(self.max_tokens, ctx.temperature, ctx.max_prompt_tokens, self.max_queries, self.static,
                                  self.weight_sum_tol)
        sample = sample_step_rubric(ctx.engine, ctx.tokenizer, queries, evidence, ctx.state, ctx.scheduler, settings)
        samples = [(sample, None)] if sample.sampled else []  # None: the global batch's reward
        return StepRubric([sample.rubric] * len(queries), samples, sample.valid, sample.error,
                          fallback=[not sample.valid] * len(queries))

    def observe(self, *args, **kwargs) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        return None
