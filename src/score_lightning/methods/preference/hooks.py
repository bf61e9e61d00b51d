"""The preference reward's hooks into a step (``evaluator.reward=preference``): score pairs with the evaluator role,
and with ``evaluator.preference.group_size`` >= 2, write each pair's group of rubrics for its own question."""

from __future__ import annotations

from score_lightning.methods.preference.groups import PreferenceGroups, preference_groups
from score_lightning.step.evaluations import group_evaluations
from score_lightning.step.rollouts import initial_evidence, scoring_rollouts
from score_lightning.step.rubric_stage import RubricSampling, fitted_rubric_prompt, sample_rubrics


class PreferenceHooks:
    """Mixed into :class:`~score_lightning.module.ScoreModule` (it owns the engines, the retriever and the state)."""

    def score_preference_pairs(self, prompts, report_pairs, rubrics) -> list:
        """Each report pair scored by the evaluator under its own rubric: ``[2][k]`` scores per pair, ``None`` for a
        pair whose evaluation did not finish (a report it never reached has no score, not 0)."""
        trajs = scoring_rollouts(self.evaluator_engine, self.tokenizer, self.retriever, prompts, report_pairs,
                                 list(rubrics), self.harness_state, self.rollout_settings)
        evals = group_evaluations(trajs, list(rubrics), 2, self.rollout_settings.scoring_protocol,
                                  self.harness_state.process_constraints, self.tokenizer,
                                  self.rollout_settings.score_readout)
        return [g.parse.score_matrix(r, 2) if g.complete else None for g, r in zip(evals, rubrics)]

    def preference_value(self, ro):
        """A thunk: the step's preference agreement for the step's own rubric (collective when called)."""
        rubric = ro.rubrics.first
        return lambda: self.preference.reward(
            self.score_step, rubric, lambda p, g: self.score_preference_pairs(p, g, [rubric] * len(p)),
            self.evaluator_engine)

    def preference_rubric_groups(self) -> PreferenceGroups:
        """G rubrics per training pair, written for its question, scored on it, group-normalised (collective)."""
        c = self.cfg
        settings = RubricSampling(int(c.evaluator.max_rubric_tokens), float(c.evaluator.temperature),
                                  int(c.evaluator.max_prompt_tokens), 1, False, c.evaluator.get("rubric_weight_sum_tol"))

        def sample_for(question: str, n: int):
            evidence, _ = initial_evidence(self.retriever, [question], int(c.solver.topk))
            messages = fitted_rubric_prompt(self.tokenizer, [question], evidence, self.harness_state, self.scheduler,
                                            settings)
            return sample_rubrics(self.evaluator_engine, self.tokenizer, messages, self.harness_state, settings, n)

        return preference_groups(self.preference, self.score_step, sample_for, self.score_preference_pairs,
                                 self.evaluator_engine, float(c.loss.adv_eps))
