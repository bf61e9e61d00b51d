"""Stage 3 with an external judge (``evaluator.source=external``): an OpenAI-compatible endpoint scores each
report under the step's rubric, pointwise, with the evaluator role's own scoring prompt and parser.

This is the static-evaluator baseline the SCORE paper argues against (GPT-4.1 as rubric judge in DR Tulu;
``experiment=grpo_judge_tiny``). Per report, one judgement: the prompt is
:func:`~score_lightning.roles.prompts.scoring_messages` (``pointwise``, with the report's retrieved ids under
``evaluator.show_retrieved``, the report cut to ``evaluator.max_report_tokens``), and the reply is read by
:func:`~score_lightning.roles.evaluation.parse_evaluation`; a reply that does not reach and close the
report's block is unusable, and one that closes it but breaks a rule (a rubric dimension without a score, a value
outside 0..10, a ``<verification>`` or ``<gap_analysis>`` the harness requires missing) is invalid: either is
asked again with the reason (``judge.max_retries``), never read as a score.

**Failures are never a score.** A judgement that still fails (a timeout, 429 or 5xx after the SDK's
retries, an unusable reply) leaves its report *unjudged*: it drops out of its group's advantages as under
``evaluator.on_incomplete=drop`` (the group is normalised over the judged reports, its tokens count
nowhere), whatever ``evaluator.on_incomplete`` says. Every judgement is counted (``judge/failed_rate``,
``judge/latency_s``, ``judge/in_flight_max``), and a step whose failed share, pooled over ranks, exceeds
``judge.max_failed_rate`` stops the run before its update with an error naming the endpoint and the failure
kinds (:func:`~score_lightning.step.faults.check_judgements`; an invalid reply counts as kind ``invalid``, the rule
it broke kept in the tally). A report with no answer is not sent: its reward is 0 whatever its scores.

The judge makes no verification searches (depth 0), so config validation refuses it with the verifier on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from score_lightning.clients.chat import ReplyError
from score_lightning.clients.judge import JudgeTally
from score_lightning.harness.state import HarnessState
from score_lightning.methods.judge.client import LLMJudge
from score_lightning.roles.evaluation import EvaluationParse, parse_evaluation
from score_lightning.roles.prompts import scoring_messages
from score_lightning.roles.rubric import Rubric
from score_lightning.rollout.chat import truncate_text
from score_lightning.step.evaluations import GroupEvaluation, meets_process_rules
from score_lightning.step.reward_assembly import StepRewards, rewards_from_evaluations, verifier_tau
from score_lightning.step.rollouts import RolloutSettings, report_citations
from score_lightning.step.scoring_sources import EVALUATOR_SOURCES, ScoringSource


def judge_of(gen) -> LLMJudge:
    """The run's judge (the ``judge`` node), built on first use in the process that scores, under that process's
    limits (``clients/limiter.configure_limits``), and kept among the generator's services."""
    if "judge" not in gen.services:
        gen.services["judge"] = LLMJudge(gen.cfg.judge)
    return gen.services["judge"]


def judged_scores(gen, ro, answers) -> StepRewards:
    """``evaluator.source=external``: the judge's pointwise judgements as the step's evaluations; no scoring rollouts,
    and a failed judgement leaves its report out of the update whatever ``evaluator.on_incomplete`` says."""
    reports, sources, shown = gen.report_groups(ro, answers)
    ro.scoring = []
    groups, tally = external_evaluations(judge_of(gen), gen.tokenizer, ro.queries, reports, ro.rubrics.per_query,
                                         gen.harness_state, gen.rollout_settings, sources, gen.retriever, shown)
    rw = rewards_from_evaluations(answers, groups, ro.rubrics.per_query, gen.K, verifier_tau(gen.cfg.verifier,
                                  gen.harness_state), gen.cfg.verifier, "drop")
    rw.judge = tally
    return rw


EVALUATOR_SOURCES.register("external", ScoringSource(judged_scores, calls_judge=True))


#: what a re-ask asks the judge for
EXPECT = "the whole corrected <report_evaluations> block"


def _reader(rubric: Rubric, state: HarnessState):
    """The evaluator role's parser, held to one report: a reply that never closes its block is unusable; one that
    closes it but breaks a parse rule (a dimension unscored, a value outside 0..10, a required section missing) is
    invalid. Both raise, so the judge is asked again with the reason and, failing that, the report stays unjudged:
    a score read from a broken reply would be a guess (0 for a missing dimension, 10 for a value of 80)."""
    pc = state.process_constraints

    def parse(text: str) -> EvaluationParse:
        ev = parse_evaluation(text, rubric, 1, require_verification=pc.require_verification,
                              require_gap_analysis=pc.require_gap_analysis)
        if not ev.reaches_every_report(1):
            raise ReplyError(f"the evaluation does not reach and close report 1 ({ev.error or 'no scores'}); "
                             "reply with the whole <report_evaluations> block")
        if not ev.valid:
            raise ReplyError(ev.error, kind="invalid")
        return ev

    return parse


def external_evaluations(judge: LLMJudge, tokenizer, queries: Sequence[str], reports: Sequence[Sequence[str | None]],
                         rubrics: Sequence[Rubric], state: HarnessState, settings: RolloutSettings,
                         sources: Sequence[Sequence[Sequence[str]]] | None = None, retriever=None,
                         shown: Sequence[Sequence[Mapping[str, str]]] | None = None,
                         ) -> tuple[list[GroupEvaluation], JudgeTally]:
    """One :class:`GroupEvaluation` per query from the judge's pointwise judgements, and their tally
    (``evaluator.show_passages``: each report with the passages it cites, as ``scoring_rollouts`` shows them)."""
    requests, where = [], []
    for i, (q, group, rubric) in enumerate(zip(queries, reports, rubrics)):
        for k, report in enumerate(group):
            if not report:
                continue
            text = truncate_text(tokenizer, report, settings.max_report_tokens)
            ids = [list(sources[i][k])] if (settings.show_retrieved and sources is not None) else None
            cited = report_citations(tokenizer, retriever, [text], [sources[i][k]] if sources is not None else None,
                                     [shown[i][k]] if shown is not None else None, settings)
            requests.append((scoring_messages(q, [text], rubric, state, ids, pointwise=True, cited=cited),
                             _reader(rubric, state), EXPECT))
            where.append((i, k))
    outcomes = judge.judge(requests)
    tally = JudgeTally(endpoint=judge.endpoint)
    tally.add(outcomes)
    tally.in_flight_max = judge.limiter.window()["in_flight_max"]
    found = {pos: out for pos, out in zip(where, outcomes)}
    pc = state.process_constraints
    groups = []
    for i, group in enumerate(reports):
        parsed, judged, ok, valid = {}, [], [], []
        for k, report in enumerate(group):
            out = found.get((i, k))
            if not report:  # nothing to judge: scores 0, and its reward is 0 through a(r) anyway
                ev, done = EvaluationParse({}, False, "no report", True), True
            elif out is not None and out.ok:
                ev, done = out.value, True
            else:
                ev, done = EvaluationParse({}, False, f"judge: {out.error if out else 'not asked'}"), False
            if 1 in ev.reports:
                parsed[k + 1] = replace(ev.reports[1], report_id=k + 1)
            judged.append(done)
            ok.append(meets_process_rules(ev, 1, pc) if done and report else True)
            valid.append(bool(ev.valid))
        merged = EvaluationParse(parsed, valid=all(valid), error="", closed=True)
        groups.append(GroupEvaluation(merged, (0,) * len(group), tuple(ok), tuple(valid), all(judged), tuple(judged)))
    return groups, tally
