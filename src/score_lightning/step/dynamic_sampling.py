"""No wasted groups: DAPO's dynamic sampling (``solver.dynamic_sampling``), as verl, ROLL and NeMo-RL ship it.

A group whose K rewards are all equal (every report invalid, or all equally good) gets advantage 0 and
teaches nothing; at a low validity rate that is a third of the batch. With ``enabled: true`` a step that
holds fewer than B informative groups (a non-zero advantage for some report) draws B more queries,
rolls them out under the step's rubric and scores them, up to ``max_draws`` draws in all. The step
then trains the first B informative groups in draw order; when the draws run out, the rest of the
batch is filled with the first uninformative groups, so every step trains exactly B groups.

Accounting: ``trainer.max_steps`` still counts SCORE steps (draws happen inside one step). The extra
queries come from a stream of their own, a pure function of ``(seed, step, draw)``
(:func:`extra_batch`), so the main query stream, and with it exact resume, is untouched; each extra
draw reuses the step's rubric, so REINFORCE still trains the one rubric sample of the step.
``solver/zero_variance_group_rate`` is the share of all drawn groups that had no signal and
``solver/sampling_draws`` the draws of the step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import Tensor

from score_lightning.step.losses import group_advantages
from score_lightning.step.reward_assembly import StepRewards
from score_lightning.step.types import StepRollouts, StepRubric

#: offsets the extra stream's seed from the main stream's, so their query orders differ
EXTRA_STREAM_SEED = 7_919


def informative_groups(rw: StepRewards, num_rollouts: int) -> Tensor:
    """[B] bool: the groups whose solver advantages are not all 0 (under ``evaluator.on_incomplete``)."""
    excluded = rw.excluded
    adv = group_advantages(rw.rewards, num_rollouts, include=~excluded if excluded.any() else None)
    return adv.masked_fill(rw.neutral, 0.0).view(-1, num_rollouts).abs().amax(dim=1) > 0


def extra_batch(stream, step: int, draw: int, max_draws: int) -> dict:
    """Draw ``draw`` (>= 1) of SCORE step ``step``: batch ``step * max_draws + draw`` of the extra stream."""
    return stream.batch(step * max_draws + draw)


def pick_groups(informative: Sequence[Sequence[bool]], needed: int) -> list[tuple[int, int]]:
    """``needed`` (draw, group) pairs: the informative groups in draw order, then the uninformative ones."""
    flat = [(d, g, ok) for d, flags in enumerate(informative) for g, ok in enumerate(flags)]
    chosen = [(d, g) for d, g, ok in flat if ok][:needed]
    chosen += [(d, g) for d, g, ok in flat if not ok][:needed - len(chosen)]
    return chosen


def merge_draws(draws: Sequence[tuple[StepRollouts, StepRewards]], picks: Sequence[tuple[int, int]],
                num_rollouts: int) -> tuple[StepRollouts, StepRewards]:
    """One step's rollouts and rewards made of the picked groups (of any draw), in pick order.

    The first draw's rubric record (its REINFORCE sample) is kept: every draw used that rubric.
    """
    K = num_rollouts
    first_ro = draws[0][0]

    def rows(d: int, g: int) -> slice:
        return slice(g * K, (g + 1) * K)

    def per_eval(rw: StepRewards, g: int) -> list[bool]:
        n = len(rw.eval_valid) // max(1, len(rw.complete))
        return rw.eval_valid[g * n:(g + 1) * n]

    def scoring(ro: StepRollouts, g: int):
        n = len(ro.scoring) // max(1, len(ro.queries))
        return ro.scoring[g * n:(g + 1) * n]

    cat = lambda pick: torch.cat([pick(*draws[d], d, g) for d, g in picks]) if picks else torch.zeros(0)  # noqa: E731
    rubrics = StepRubric([draws[d][0].rubrics.per_query[g] for d, g in picks], first_ro.rubrics.samples,
                         first_ro.rubrics.valid, first_ro.rubrics.error, dict(first_ro.rubrics.stats),
                         [draws[d][0].rubrics.fallback[g] if draws[d][0].rubrics.fallback else False for d, g in picks])
    ro = StepRollouts(
        queries=[draws[d][0].queries[g] for d, g in picks], rubrics=rubrics,
        evidence=[draws[d][0].evidence[g] for d, g in picks], evidence_errors=sum(r.evidence_errors for r, _ in draws),
        solver=[t for d, g in picks for t in draws[d][0].solver[rows(d, g)]],
        scoring=[t for d, g in picks for t in scoring(draws[d][0], g)],
        query_ids=[draws[d][0].query_ids[g] for d, g in picks])
    first_rw = draws[0][1]
    rw = replace(
        first_rw,
        answers=[a for d, g in picks for a in draws[d][1].answers[rows(d, g)]],
        validity=cat(lambda ro_, rw_, d, g: rw_.validity[rows(d, g)]),
        item_scores=[draws[d][1].item_scores[g] for d, g in picks],
        rubric_part=cat(lambda ro_, rw_, d, g: rw_.rubric_part[rows(d, g)]),
        depth=cat(lambda ro_, rw_, d, g: rw_.depth[rows(d, g)]),
        verified=cat(lambda ro_, rw_, d, g: rw_.verified[rows(d, g)]),
        process_ok=cat(lambda ro_, rw_, d, g: rw_.process_ok[rows(d, g)]),
        eval_valid=[v for d, g in picks for v in per_eval(draws[d][1], g)],
        rewards=cat(lambda ro_, rw_, d, g: rw_.rewards[rows(d, g)]),
        reports_valid=[v for d, g in picks for v in draws[d][1].reports_valid[rows(d, g)]],
        complete=[draws[d][1].complete[g] for d, g in picks],
        judged=[j for d, g in picks for j in draws[d][1].judged[rows(d, g)]],
        judge=_tallies([rw_.judge for _, rw_ in draws]),  # every draw's judgements count, the trained ones or not
        dropped=[v for d, g in picks for v in (draws[d][1].dropped or [False] * len(draws[d][1].answers))[rows(d, g)]],
        citation=_sums([rw_.citation for _, rw_ in draws]))
    return ro, rw


def _sums(stats):
    """The citation judge's sums over all draws (None without it)."""
    present = [s for s in stats if s is not None]
    return {k: sum(s[k] for s in present) for k in present[0]} if present else None


def _tallies(tallies):
    """The external judge's tallies of all draws, merged (None without an external judge)."""
    present = [t for t in tallies if t is not None]
    if not present:
        return None
    out = present[0]
    for t in present[1:]:
        out = out.merge(t)
    return out
