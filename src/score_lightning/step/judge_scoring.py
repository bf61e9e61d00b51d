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
kinds (:func:`check_judgements`; an invalid reply counts as kind ``invalid``, the rule it broke kept in the tally).
A report with no answer is not sent: its reward is 0 whatever its scores.

The judge makes no verification searches (depth 0), so config validation refuses it with the verifier on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from score_lightning import distributed as D
from score_lightning.clients.chat import ReplyError
from score_lightning.clients.judge import JudgeTally, LLMJudge
from score_lightning.errors import JudgeUnavailable
from score_lightning.harness.state import HarnessState
from score_lightning.roles.evaluation import EvaluationParse, parse_evaluation
from score_lightning.roles.prompts import scoring_messages
from score_lightning.roles.rubric import Rubric
from score_lightning.rollout.chat import truncate_text
from score_lightning.step.evaluations import GroupEvaluation, meets_process_rules
from score_lightning.step.rollouts import RolloutSettings, report_citations

if TYPE_CHECKING:
    from score_lightning.config.schema import EvaluatorConfig, JudgeConfig, RewardConfig, RolloutConfig

SOURCES = ("policy", "external")


def uses_judge(evaluator: "EvaluatorConfig", reward: "RewardConfig") -> bool:
    """Does the run send judgements to the ``judge`` endpoint (the same on every rank)? An external evaluator, or
    ``reward.citation_judge``."""
    return str(evaluator.source) == "external" or bool(reward.citation_judge.enabled)


def configure_limits(judge: "JudgeConfig", rollout: "RolloutConfig", rank: int, world_size: int,
                     worker: bool = False) -> None:
    """This process's limits on every external chat call (judge, meta-harness, rubric writer, appraisal): its
    share of the run's ``judge.max_concurrency`` and ``judge.requests_per_minute``, split among the processes
    that make calls (the ``world_size`` training processes, and the rollout worker under ``rollout.mode=async``,
    which counts after them), so that the endpoint sees the run's limits with no traffic between processes. A
    process calls it before its first request."""
    from score_lightning.clients.limiter import configure_limiter, process_share

    processes = int(world_size) + (1 if str(rollout.mode) == "async" else 0)
    index = int(world_size) if worker else int(rank)
    j = judge
    total, rpm = int(j.max_concurrency), int(j.requests_per_minute)
    short = total < processes or 0 < rpm < processes  # refused by config validation when the judge is used
    notice = (f"judge.max_concurrency={total} / judge.requests_per_minute={rpm} are the run's limits, below the "
              f"{processes} processes that may make external chat calls: each still gets 1, so the run may exceed "
              "them") if short else ""
    configure_limiter(process_share(total, index, processes), process_share(rpm, index, processes),
                      float(j.queue_timeout_s), notice)


def build_judge(judge: "JudgeConfig") -> LLMJudge:
    """The run's judge (the ``judge`` node), under the process's limits (:func:`configure_limits`)."""
    return LLMJudge(judge)


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


def check_judgements(tally: JudgeTally | None, max_failed_rate: float, checkpoint_dir: str | Path) -> dict[str, float]:
    """The step's judge scalars, pooled over ranks (collective); :class:`JudgeUnavailable` when the failed share
    exceeds ``judge.max_failed_rate`` (before the step's update: the last checkpoint stays the one to resume)."""
    tallies = [t for t in D.gather_objects(tally) if t is not None]
    if not tallies:
        return {}
    pooled = tallies[0]
    for t in tallies[1:]:
        pooled = pooled.merge(t)
    if pooled.requests and pooled.failed_rate > max_failed_rate:
        last = Path(checkpoint_dir) / "last.ckpt"
        resume = (f"the last checkpoint, {last}, is untouched: fix the judge and resume with ckpt_path=last"
                  if last.exists() else "no checkpoint was saved yet: fix the judge and start again")
        raise JudgeUnavailable(
            f"the external judge failed {pooled.failed_rate:.0%} of this step's judgements, above "
            f"judge.max_failed_rate={max_failed_rate:g}: {pooled.describe()}. The step was not trained; {resume}")
    return pooled.metrics()
