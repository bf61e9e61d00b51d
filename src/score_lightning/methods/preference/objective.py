"""``evaluator.reward=preference`` as a plug-in: the reward's value and its evaluator objective.

The reward (:mod:`~score_lightning.methods.preference.reward`): R = the share of held-out preference pairs that
scoring with the rubric ranks the right way, optionally mixed with an LLM appraisal of the rubric. It has no
per-query value: a query's own rubric earns the step's value too.

The objective, in Phase 2 after the solver's update (it scores with the updated evaluator): with
``evaluator.preference.group_size`` 1 the step's rubric scores the pairs and earns their agreement; with G >= 2 the
evaluator writes G rubrics for each pair's own question, and those (:mod:`~score_lightning.methods.preference.groups`)
train by GRPO instead of the step's rubric, which then only logs their mean agreement.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from score_lightning.methods.preference.groups import PreferenceGroups, preference_groups
from score_lightning.methods.preference.reward import PreferenceReward
from score_lightning.step.evaluations import group_evaluations
from score_lightning.step.evaluator_objective import EvaluatorObjective, StepView
from score_lightning.step.evaluator_reward import EvaluatorReward, RewardInputs
from score_lightning.step.objectives import EVALUATOR_REWARDS
from score_lightning.step.rollouts import initial_evidence, scoring_rollouts
from score_lightning.step.rubric_stage import RubricSampling, fitted_rubric_prompt, sample_rubrics
from score_lightning.step.scalars import StepScalars

if TYPE_CHECKING:
    from score_lightning.config.schema import EvaluatorConfig, LossConfig, SolverConfig


class PreferenceObjective(EvaluatorObjective):
    """Scores preference pairs with the evaluator role; with G >= 2, writes and trains each pair's group of rubrics."""

    def __init__(self, reward: PreferenceReward, sampling: RubricSampling, topk: int, eps: float):
        self.reward, self.sampling, self.topk, self.eps = reward, sampling, topk, eps
        self.trains_step_rubric = int(reward.group_size) <= 1  # G >= 2: the pair rubrics train instead
        self.groups: PreferenceGroups | None = None  # the step's pair rubrics (G >= 2)

    def measure(self, step: StepView) -> float:
        """The step's agreement: of its pair rubrics (G >= 2), or of the step's own rubric (collective)."""
        if not self.trains_step_rubric:
            self.groups = self.rubric_groups(step)
            return self.groups.agreement
        rubric, host = step.rollouts.rubrics.first, step.host
        return self.reward.reward(step.step, rubric, lambda p, g: self.score_pairs(host, p, g, [rubric] * len(p)),
                                  host.evaluator_engine)

    def fold(self, trained: list | None, advantages: list[float]) -> tuple[list | None, list[float]]:
        return self.groups.fold(trained, advantages) if self.groups is not None else (trained, advantages)

    def scalars(self) -> dict[str, float]:
        out = {"evaluator/preference_incomplete_rate": self.reward.incomplete_rate}  # left out of the reward, counted
        if self.reward.appraisal_weight > 0:
            out["evaluator/appraisal_failures"] = float(self.reward.appraisal_failures)  # cumulative
        return out

    def score_pairs(self, host, prompts, report_pairs, rubrics) -> list:
        """Each report pair scored by the evaluator under its own rubric: ``[2][k]`` scores per pair, ``None`` for a
        pair whose evaluation did not finish (a report it never reached has no score, not 0)."""
        trajs = scoring_rollouts(host.evaluator_engine, host.tokenizer, host.retriever, prompts, report_pairs,
                                 list(rubrics), host.harness_state, host.rollout_settings)
        evals = group_evaluations(trajs, list(rubrics), 2, host.rollout_settings.scoring_protocol,
                                  host.harness_state.process_constraints, host.tokenizer,
                                  host.rollout_settings.score_readout)
        return [g.parse.score_matrix(r, 2) if g.complete else None for g, r in zip(evals, rubrics)]

    def rubric_groups(self, step: StepView) -> PreferenceGroups:
        """G rubrics per training pair, written for its question, scored on it, group-normalised (collective)."""
        host = step.host

        def sample_for(question: str, n: int):
            evidence, _ = initial_evidence(host.retriever, [question], self.topk)
            messages = fitted_rubric_prompt(host.tokenizer, [question], evidence, host.harness_state, host.scheduler,
                                            self.sampling)
            return sample_rubrics(host.evaluator_engine, host.tokenizer, messages, host.harness_state, self.sampling, n)

        return preference_groups(self.reward, step.step, sample_for, lambda *a: self.score_pairs(host, *a),
                                 host.evaluator_engine, self.eps)


def preference_objective(evaluator: "EvaluatorConfig", solver: "SolverConfig",
                         loss: "LossConfig") -> PreferenceObjective:
    """The objective from ``evaluator`` (the pair scorer ``evaluator.preference``, the rubric writer's sampling), the
    solver's ``topk`` (each pair question's evidence) and the advantages' epsilon (``loss.adv_eps``)."""
    from hydra.utils import instantiate

    e = evaluator
    sampling = RubricSampling(int(e.max_rubric_tokens), float(e.temperature), int(e.max_prompt_tokens), 1, False,
                              e.rubric_weight_sum_tol)
    return PreferenceObjective(instantiate(e.preference, _convert_="all"), sampling, int(solver.topk),
                               float(loss.adv_eps))


def measured_agreement(inputs: RewardInputs, scalars: StepScalars) -> float:
    """The agreement the objective measured (NaN: none)."""
    return math.nan if inputs.measured is None else float(inputs.measured)


EVALUATOR_REWARDS.register("preference", EvaluatorReward(
    measured_agreement, None, lambda cfg: preference_objective(cfg.evaluator, cfg.solver, cfg.loss)))
