"""Reports to pair, and the scores of both sides of every pair (``scripts/bench_evaluator.py``).

* :func:`sample_reports`: ``samples`` solver rollouts per held-out query through the step's own
  :func:`~score_lightning.step.rollouts.solver_rollouts`, at the recipe's solver budgets and temperature, under
  the harness's fallback rubric (as ``evaluate.py generate`` samples held-out answers, so the pair set depends
  on the solver and the seed only, never on the evaluator it will measure).
* :func:`query_rubrics`: the rubric each query is judged under, from the recipe's own rubric source
  (``rubric=score``: a rubric sampled by the evaluator as the step samples it, one per ``data.batch_size``
  queries; ``static_rubric``: the fallback; ``evolving``: its initial items for the query; ``given``: the
  file's), through the source's own ``step_rubrics``.
* :func:`evaluator_scores`: the recipe's evaluator scores the reports through the step's
  :func:`~score_lightning.step.rollouts.scoring_rollouts` and
  :func:`~score_lightning.step.evaluations.group_evaluations`, under ``evaluator.scoring``, ``show_retrieved``,
  ``show_passages`` (the cited passages from the retriever's corpus), ``constrained_scoring`` and ``score_readout``. ``pointwise``: each distinct report once, alone (a report in
  several pairs keeps one score); ``joint``: each pair's two reports in one evaluation, in the stored order.
* :func:`judge_scores`: an external OpenAI-compatible judge gets the same scoring messages and its reply goes
  through the same parser (it has no search tool: its searches are not run).

A side's score is Σ_j w_j s_j as the reward reads it (:func:`~score_lightning.step.reward_assembly.rubric_part`:
binary items met or not, a rubric with negative items clipped to [0, 1]), zero when its evaluation broke a
process rule of the harness (the process gate). The reward verifier is not applied: it judges the evaluation's
searches, not the report, and under the default ``verifier.zero=reward`` it zeroes the reward, not the score
part. A side no complete evaluation reached (cut by its budget, ended early; for the judge, a request that
failed after its retries) has no score: it is counted, and its pairs are left out, never scored 0.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch
from omegaconf import OmegaConf

from score_lightning.evaluation.pair_build import Pair, Sample
from score_lightning.clients.chat import ChatClient, ReplyError
from score_lightning.harness.state import HarnessState
from score_lightning.roles.evaluation import EvaluationParse, parse_evaluation
from score_lightning.roles.prompts import scoring_messages
from score_lightning.roles.rubric import Rubric, fallback_rubric
from score_lightning.step.rubric_source import RubricContext
from score_lightning.step.evaluations import group_evaluations, meets_process_rules
from score_lightning.step.reward_assembly import parse_answers, rubric_part
from score_lightning.step.rollouts import RolloutSettings, initial_evidence, scoring_rollouts, solver_rollouts

if TYPE_CHECKING:
    from score_lightning.config.schema import RewardConfig

NO_REPORT = "(no report)"
#: what a judge's unusable reply is re-asked for (it has no search tool: no observation will come)
REASK = "the complete <report_evaluations> block (no <search>: no search results will come)"


def sample_reports(engine, tokenizer, retriever, queries: Sequence[tuple[str, str]], state: HarnessState,
                   settings: RolloutSettings, reward: "RewardConfig", samples: int, batch: int) -> list[Sample]:
    """``samples`` reports per ``(query id, prompt)``, each with its retrieved ids and grounded validity
    (``reward`` with ``reward.citations=retrieved`` and a required citation, as the card reads it)."""
    settings = replace(settings, num_rollouts=samples)
    grounded = OmegaConf.merge(reward, {"require_citation": True, "citations": "retrieved"})
    rubric = fallback_rubric(state)
    per = max(1, batch // samples)
    out: list[Sample] = []
    for start in range(0, len(queries), per):
        block = list(queries[start:start + per])
        trajs = solver_rollouts(engine, tokenizer, retriever, [q for _, q in block], [rubric] * len(block), state,
                                settings)
        for i, (traj, ans) in enumerate(zip(trajs, parse_answers(trajs, tokenizer, grounded))):
            qid, prompt = block[i // samples]
            out.append(Sample(qid, prompt, ans.answer or None, tuple(traj.retrieved_ids), bool(ans.valid), i % samples))
    return out


def query_rubrics(source, ctx: RubricContext, queries: Sequence[tuple[str, str]], batch_size: int,
                  topk: int) -> tuple[dict[str, Rubric], int]:
    """The rubric of every ``(query id, prompt)`` from ``source`` (the recipe's ``rubric`` group, instantiated),
    ``batch_size`` queries per ``step_rubrics`` call as a step holds them; and how many fell back to the
    harness's fallback rubric (a sampled rubric that did not parse, a query with no given rubric)."""
    out: dict[str, Rubric] = {}
    fallback = 0
    for start in range(0, len(queries), max(1, batch_size)):
        block = list(queries[start:start + max(1, batch_size)])
        evidence, _ = initial_evidence(ctx.retriever, [q for _, q in block], topk)
        step = source.step_rubrics(ctx, [q for _, q in block], [qid for qid, _ in block], evidence)
        for (qid, _), rubric, fb in zip(block, step.per_query, step.fallback or [False] * len(block)):
            out[qid] = rubric
            fallback += int(bool(fb))
    return out, fallback


def judge_rubrics(source, state: HarnessState, query_ids: Sequence[str]) -> tuple[dict[str, Rubric], str]:
    """The rubrics an external judge scores under: the recipe's when they need no model to write them
    (``given``: the file's; ``static_rubric``: the fallback), else the harness's fallback rubric."""
    from score_lightning.methods.given.rubrics import GivenRubrics

    if isinstance(source, GivenRubrics):
        return {q: source.rubrics.get(str(q), fallback_rubric(state)) for q in query_ids}, "given"
    static = bool(getattr(source, "static", False))
    return {q: fallback_rubric(state) for q in query_ids}, "static" if static else "fallback (no model to write one)"


@dataclass
class ScoringOutcome:
    """Per pair, the score of each side in stored order (None: no complete judgement of it)."""

    scores: list[tuple[float | None, float | None]]
    judgements: int  # evaluations asked for (pointwise: distinct reports; joint: pairs)
    failed: int  # of those, how many gave no score
    errors: Counter = field(default_factory=Counter)  # why, by kind

    @property
    def failed_rate(self) -> float:
        return self.failed / self.judgements if self.judgements else 0.0


def _part(ev: EvaluationParse, rubric: Rubric, k: int, n: int, process_ok: bool) -> float:
    if not process_ok:
        return 0.0
    row = torch.tensor([ev.score_matrix(rubric, n)[k]], dtype=torch.float32)
    return float(rubric_part(row, rubric)[0])


def _units(pairs: Sequence[Pair], pointwise: bool) -> tuple[list[tuple[str, str, list]], list[list[int]]]:
    """The judgements to ask for, ``(query id, query, [(text, retrieved), ...])`` each, and for every pair the
    judgement-report slot of each side (pointwise: one slot per distinct report of a query)."""
    units: list[tuple[str, str, list]] = []
    slots: list[list[int]] = []
    if not pointwise:
        for p in pairs:
            units.append((p.query_id, p.query, [(s.text, s.retrieved) for s in p.sides]))
            slots.append([2 * (len(units) - 1), 2 * (len(units) - 1) + 1])
        return units, slots
    index: dict[tuple, int] = {}
    for p in pairs:
        row = []
        for s in p.sides:
            key = (p.query_id, s.text, s.retrieved)
            if key not in index:
                index[key] = len(units)
                units.append((p.query_id, p.query, [(s.text, s.retrieved)]))
            row.append(index[key])
        slots.append(row)
    return units, slots


def _gather(pairs: Sequence[Pair], units: list, slots: list[list[int]], per_unit: list[list[float | None]],
            pointwise: bool, errors: Counter) -> ScoringOutcome:
    flat = [v for u in per_unit for v in u] if not pointwise else [u[0] for u in per_unit]
    scores = [(flat[a], flat[b]) for a, b in slots]
    failed = sum(any(v is None for v in u) for u in per_unit)
    return ScoringOutcome(scores, len(units), failed, errors)


def evaluator_scores(engine, tokenizer, retriever, pairs: Sequence[Pair], rubrics: dict[str, Rubric],
                     state: HarnessState, settings: RolloutSettings, batch: int) -> ScoringOutcome:
    """Both sides of every pair scored by the recipe's evaluator (module docstring), ``batch`` evaluations per
    generate call."""
    pointwise = settings.scoring_protocol == "pointwise"
    units, slots = _units(pairs, pointwise)
    n = 1 if pointwise else 2
    step = max(1, batch)
    pc = state.process_constraints
    per_unit: list[list[float | None]] = []
    errors: Counter = Counter()
    for start in range(0, len(units), step):
        block = units[start:start + step]
        rs = [rubrics[qid] for qid, _, _ in block]
        trajs = scoring_rollouts(engine, tokenizer, retriever, [q for _, q, _ in block],
                                 [[t for t, _ in reps] for _, _, reps in block], rs, state, settings,
                                 [[list(r) for _, r in reps] for _, _, reps in block])
        for g, rubric in zip(group_evaluations(trajs, rs, n, settings.scoring_protocol, pc, tokenizer,
                                               settings.score_readout), rs):
            judged = g.judged or (g.complete,) * n
            row = [_part(g.parse, rubric, k, n, g.process_ok[k]) if judged[k] else None for k in range(n)]
            errors.update(["incomplete"] * any(v is None for v in row))
            per_unit.append(row)
    return _gather(pairs, units, slots, per_unit, pointwise, errors)


def judge_scores(client: ChatClient, pairs: Sequence[Pair], rubrics: dict[str, Rubric], state: HarnessState,
                 protocol: str, show_retrieved: bool, concurrency: int = 4) -> ScoringOutcome:
    """Both sides of every pair scored by an external judge: the evaluator's scoring messages, its parser, at
    most ``concurrency`` requests in flight; a judgement that still fails after the client's retries is counted
    by its error kind and gives no score."""
    pointwise = protocol == "pointwise"
    units, slots = _units(pairs, pointwise)
    pc = state.process_constraints

    def judge(unit) -> tuple[list[float | None], str | None]:
        qid, query, reps = unit
        rubric, n = rubrics[qid], len(reps)
        shown = [t if t else NO_REPORT for t, _ in reps]
        sources = [list(r) for _, r in reps] if show_retrieved else None
        msgs = scoring_messages(query, shown, rubric, state, sources, pointwise=pointwise)

        def parse(text: str) -> EvaluationParse:
            ev = parse_evaluation(text, rubric, n, require_verification=pc.require_verification,
                                  require_gap_analysis=pc.require_gap_analysis)
            if not ev.reaches_every_report(n):
                raise ReplyError(f"the evaluation does not close a <report> block for each of reports 1..{n}"
                                 + (f" ({ev.error})" if ev.error else ""))
            return ev

        outcome = client.ask(msgs, parse, expect=REASK)
        if not outcome.ok:
            return [None] * n, outcome.error
        ok = meets_process_rules(outcome.value, n, pc)
        return [_part(outcome.value, rubric, k, n, ok) for k in range(n)], None

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        results = list(pool.map(judge, units))
    errors = Counter(err for _, err in results if err is not None)
    return _gather(pairs, units, slots, [r for r, _ in results], pointwise, errors)
