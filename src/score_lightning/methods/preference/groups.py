"""``evaluator.reward=preference`` with ``evaluator.preference.group_size`` G >= 2: GRPO over rubrics, per pair.

Preference-trained rubric generators sample a group of rubrics for one question, judge its preference pair with
each, and train the generator by GRPO on whether each rubric ranks the pair right. Here, each step, for each of the
step's ``pairs_per_step`` training pairs:

1. the evaluator writes G rubrics **for that pair's own question** (the rubric prompt lists that query and its
   top documents, under the harness constraints; one generate call of G samples);
2. each rubric scores the pair as the evaluator scores reports (``evaluator.scoring``; the pair's positions
   alternate from pair to pair);
3. rubric g's reward is r_g = 1 when the chosen report's rubric-weighted score is higher, 1/2 on a tie, 0 otherwise,
   mixed with the appraisal as :class:`~score_lightning.methods.preference.reward.PreferenceReward` mixes it;
4. its advantage is group-normalised over the pair's G rubrics, A_g = (r_g - mean) / (std + eps) (unbiased std,
   as GRPO's); a group whose rewards are all equal teaches nothing (A = 0).

A rubric whose evaluation of the pair did not finish has no reward (its missing score is no 0): that sample leaves
the group, which is normalised over the rest, and is counted (``evaluator/preference_incomplete_rate``).

These rubric samples are the evaluator's REINFORCE rows for the step (folded like the scoring samples: the loss is
the mean over them); the step's own rubric, which the solver is scored under, is not trained by the preference
reward, and ``evaluator/reward`` logs the step's mean agreement. Rank 0 samples and scores (every rank with a
collective engine), and every rank receives the same samples, so every rank computes the same loss.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from score_lightning import distributed as D
from score_lightning.rollout.engine import is_collective
from score_lightning.methods.preference.reward import PreferenceReward, agreement, ordered
from score_lightning.step.evaluator_phase import fold_rows
from score_lightning.step.types import RubricSample


def group_advantages(rewards: Sequence[float], eps: float = 1e-6) -> list[float]:
    """GRPO within one group: (r - mean) / (unbiased std + eps); all 0 for fewer than two or equal rewards."""
    n = len(rewards)
    if n < 2 or max(rewards) == min(rewards):
        return [0.0] * n
    mean = sum(rewards) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (n - 1))
    return [(r - mean) / (std + eps) for r in rewards]


@dataclass
class PreferenceGroups:
    """The step's pair rubrics, their rewards and GRPO advantages (the same on every rank)."""

    samples: list[RubricSample] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    advantages: list[float] = field(default_factory=list)
    scored: int = 0  # pair evaluations (one per rubric and pair)
    incomplete: int = 0  # ... that did not finish: their samples left out

    @property
    def incomplete_rate(self) -> float:
        return self.incomplete / self.scored if self.scored else math.nan

    @property
    def agreement(self) -> float:
        return sum(self.rewards) / len(self.rewards) if self.rewards else math.nan

    def fold(self, trained: list | None, advantages: list[float]) -> tuple[list | None, list[float]]:
        """The update's rows: these samples, after any other part (each part keeps its mean, as the fold of the
        scoring samples does)."""
        rows = [s for s in self.samples if s.sampled]
        adv = [a for s, a in zip(self.samples, self.advantages) if s.sampled]
        if not rows:
            return trained, advantages
        return fold_rows(trained or [], advantages if trained is not None else [], rows, adv)


def preference_groups(pref: PreferenceReward, step: int, sample_for: Callable[[str, int], list[RubricSample]],
                      score_pairs: Callable, engine=None, eps: float = 1e-6) -> PreferenceGroups:
    """Sample, score and reward G rubrics per training pair (module docstring). Collective.

    ``sample_for(question, G)`` writes G rubrics for one question; ``score_pairs(prompts, report_pairs, rubrics)``
    scores each report pair under its own rubric and returns each pair's ``[2][k]`` scores, ``None`` where the
    evaluation did not finish (that sample is left out of its group).
    """
    pairs, g = pref.choose(step), int(pref.group_size)
    out = None
    if D.rank() == 0 or is_collective(engine):
        groups = [sample_for(p["prompt"], g) for p in pairs]
        flips = [i % 2 == 1 for i in range(len(pairs))]  # alternate positions from pair to pair: no position bias
        prompts, reports, rubrics = [], [], []
        for pair, flip, group in zip(pairs, flips, groups):
            for sample in group:
                prompts.append(pair["prompt"])
                reports.append(ordered(pair, flip))
                rubrics.append(sample.rubric)
        matrices = iter(score_pairs(prompts, reports, rubrics))
        out = PreferenceGroups()
        for pair, flip, group in zip(pairs, flips, groups):
            finished = [(s, rows) for s in group if (rows := next(matrices)) is not None]
            rewards = [pref.hybrid(agreement(s.rubric, rows, flip), s.rubric, pair) for s, rows in finished]
            out.samples.extend(s for s, _ in finished)
            out.rewards.extend(rewards)
            out.advantages.extend(group_advantages(rewards, eps))
            out.scored += len(group)
            out.incomplete += len(group) - len(finished)
    out = D.broadcast_object(out)
    pref.scored, pref.incomplete = out.scored, out.incomplete  # what the step logs
    return out
