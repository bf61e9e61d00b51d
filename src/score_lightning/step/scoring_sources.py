"""Who scores a step's reports (``reward.source``, ``evaluator.source``), and the reward terms added after.

Why registries: SCORE's reports are scored by the policy's own evaluator role (``reward.source=evaluator`` with
``evaluator.source=policy``). A baseline that scores them another way (an external LLM judge, the rule reward) is a
plug-in under :mod:`score_lightning.methods` that registers its source here, so the generator never names one
(docs/EXTENDING.md, "Scoring sources and reward terms").

* :data:`REWARD_SOURCES` (``reward.source``): where the rewards come from; ``evaluator`` (here) defers to
  ``evaluator.source``;
* :data:`EVALUATOR_SOURCES` (``evaluator.source``): who writes the evaluations; ``policy`` (here) is the evaluator
  role's scoring rollouts;
* :data:`REWARD_TERMS`: a term added to the rewards after scoring, whatever scored them, while its config enables it.

An entry's ``score`` or ``add`` receives the :class:`~score_lightning.generation.generator.Generator` (its
tokenizer, engines, retriever, settings and ``services``), the step's rollouts, and the parsed answers or rewards.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from score_lightning.registry import Registry
from score_lightning.step.reward_assembly import StepRewards, assemble_rewards
from score_lightning.step.rollouts import scoring_rollouts


@dataclass(frozen=True)
class ScoringSource:
    """``score(generator, rollouts, answers) -> StepRewards``. ``calls_judge``: its scores come from the ``judge``
    endpoint, so the step counts its failed judgements and stops before the update when too many failed."""

    score: Callable[..., StepRewards]
    calls_judge: bool = False


@dataclass(frozen=True)
class RewardTerm:
    """``add(generator, rollouts, rewards) -> StepRewards`` on every step while ``enabled(cfg)``."""

    enabled: Callable[[Any], bool]
    add: Callable[..., StepRewards]
    calls_judge: bool = False


REWARD_SOURCES: Registry[ScoringSource] = Registry("reward.source")
EVALUATOR_SOURCES: Registry[ScoringSource] = Registry("evaluator.source")
REWARD_TERMS: Registry[RewardTerm] = Registry("a reward term")


def _resolved_by_step_scorer(*args) -> StepRewards:
    raise RuntimeError("reward.source=evaluator scores through evaluator.source's source (step_scorer)")


def policy_scores(gen, ro, answers) -> StepRewards:
    """``evaluator.source=policy`` (SCORE): the evaluator role's scoring rollouts judge the K reports of each query;
    the rewards come with their gates and the verifier."""
    reports, sources, shown = gen.report_groups(ro, answers)
    ro.scoring = scoring_rollouts(gen.evaluator_engine, gen.tokenizer, gen.retriever, ro.queries, reports,
                                  ro.rubrics.per_query, gen.harness_state, gen.rollout_settings, sources, shown)
    gen.release_caches()
    return assemble_rewards(answers, ro.scoring, ro.rubrics.per_query, gen.harness_state, gen.K, gen.cfg.evaluator,
                            gen.cfg.verifier, gen.tokenizer)


#: ``reward.source=evaluator``: the rewards come from the evaluations ``evaluator.source`` names
EVALUATIONS = REWARD_SOURCES.register("evaluator", ScoringSource(_resolved_by_step_scorer))
EVALUATOR_SOURCES.register("policy", ScoringSource(policy_scores))


def step_scorer(reward, evaluator) -> ScoringSource:
    """The source that scores a step under the ``reward`` and ``evaluator`` nodes."""
    source = REWARD_SOURCES.get(str(reward.source))
    return EVALUATOR_SOURCES.get(str(evaluator.source)) if source is EVALUATIONS else source


def reward_terms(cfg) -> list[RewardTerm]:
    """The registered terms ``cfg`` enables, in name order."""
    return [term for _, term in REWARD_TERMS.items() if term.enabled(cfg)]
