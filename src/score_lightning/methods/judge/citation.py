"""DR Tulu's citation reward through the external judge (``reward.citation_judge``, off by default).

After the step's rewards are assembled (whatever scored them: the evaluator role, the external judge, or the
rule reward), each *valid* report (a(r) = 1) with at least one claim is sent to the ``judge`` endpoint once:
its claims, the ids each cites, and the text of those passages as the solver's own searches showed them
(ReAct's observations, or what MaMs's search role read; each passage cut to ``max_passage_chars``). The judge
says, per cited claim, whether the passages support it (recall) and which of them are relevant (precision), and
per uncited claim whether it needed a source (``citation_prompts.py``; the scores are
``methods/judge/citation_claims.py``). The report's reward then gains

    R <- R + weight * a(r) * mean-over-claims F1(precision, recall)

so an invalid report still earns 0. A failed citation judgement is never a score: that report leaves the
update (as ``evaluator.on_incomplete=drop``), and the judgement counts in ``judge/failed_rate`` with every
other one of the step. ``solver/citation_judge_f1``, ``_precision`` and ``_recall`` are the means over the
reports it judged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from score_lightning.clients.judge import JudgeTally
from score_lightning.methods.judge.citation_prompts import citation_check_messages, citation_check_reader
from score_lightning.methods.judge.client import LLMJudge
from score_lightning.methods.judge.scoring import judge_of
from score_lightning.methods.judge.citation_claims import citation_score, report_claims
from score_lightning.rollout.search_steps import shown_passages
from score_lightning.rollout.trajectory import Trajectory
from score_lightning.step.reward_assembly import StepRewards
from score_lightning.step.scoring_sources import REWARD_TERMS, RewardTerm

if TYPE_CHECKING:
    from score_lightning.config.schema import CitationJudgeConfig


def add_citation_reward(judge: LLMJudge, tokenizer, queries: Sequence[str], solver: Sequence[Trajectory],
                        rw: StepRewards, num_rollouts: int, settings: "CitationJudgeConfig") -> StepRewards:
    """``rw`` with the citation term added, failed judgements dropped, the stats and the judge tally updated
    (``settings``: the ``reward.citation_judge`` node)."""
    requests, where = [], []
    for n, (answer, traj) in enumerate(zip(rw.answers, solver)):
        if not answer.valid or not answer.answer:
            continue
        claims = report_claims(answer.answer, traj.retrieved_ids, int(settings.max_claims))
        if not claims:
            continue
        passages = {d: t[:int(settings.max_passage_chars)] for d, t in shown_passages(traj, tokenizer).items()}
        requests.append((citation_check_messages(queries[n // num_rollouts], claims, passages),
                         citation_check_reader(claims)))
        where.append((n, claims, set(traj.retrieved_ids)))
    outcomes = judge.judge(requests)
    tally = JudgeTally(endpoint=judge.endpoint)
    tally.add(outcomes)
    tally.in_flight_max = judge.limiter.window()["in_flight_max"]
    term = torch.zeros_like(rw.rewards)
    dropped = list(rw.dropped) if rw.dropped else [False] * len(rw.answers)
    sums = {"precision": 0.0, "recall": 0.0, "f1": 0.0, "n": 0.0}
    for (n, claims, retrieved), out in zip(where, outcomes):
        if not out.ok:
            dropped[n] = True
            continue
        precision, recall, f1 = citation_score(claims, out.value, retrieved)
        term[n] = f1
        for key, value in (("precision", precision), ("recall", recall), ("f1", f1), ("n", 1.0)):
            sums[key] += value
    rw.rewards = rw.rewards + float(settings.weight) * rw.validity * term
    rw.dropped = dropped
    rw.citation = sums
    rw.judge = tally if rw.judge is None else rw.judge.merge(tally)
    return rw


def _citation_term(gen, ro, rw: StepRewards) -> StepRewards:
    return add_citation_reward(judge_of(gen), gen.tokenizer, ro.queries, ro.solver, rw, gen.K,
                               gen.cfg.reward.citation_judge)


REWARD_TERMS.register("citation_judge", RewardTerm(lambda cfg: bool(cfg.reward.citation_judge.enabled),
                                                   _citation_term, calls_judge=True))
