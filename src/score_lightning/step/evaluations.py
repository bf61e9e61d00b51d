"""From scoring trajectories to one :class:`GroupEvaluation` per query, for either scoring protocol.

``evaluator.scoring=joint`` (the paper's Listing 4): one evaluation per query scores all K reports,
so its searches verify every report and a process rule it breaks gates all of them.
``evaluator.scoring=pointwise`` (DR Tulu's judge and most rubric-RL systems): one evaluation per
report, in its own prompt; searches, verification depth, the process gate and completeness are per
report. Both become the same per-query record here, so reward assembly, the logs and the probes do not
care which protocol produced it.

**Incomplete evaluations.** An evaluation that was cut by its budget, or ended before it closed every
report's block, says nothing about the reports it did not reach. Each report records whether a complete
evaluation judged it (``judged``: under ``joint`` the group's one evaluation, under ``pointwise`` the
report's own); what an unjudged report's reward becomes is ``evaluator.on_incomplete``
(``step/reward_assembly.py``). ``evaluator/incomplete_rate`` counts groups with an incomplete evaluation.

**Readout** (``evaluator.score_readout``): ``sampled`` reads each score as the value the evaluator wrote;
``expected`` as the expected value the decoder read at that value (``Trajectory.value_readouts``,
:mod:`~score_lightning.rollout.value_readout`), in either protocol, through the same parse.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from score_lightning.harness.state import ProcessConstraints
from score_lightning.roles.evaluation import EvaluationParse, parse_evaluation, with_values
from score_lightning.roles.rubric import Rubric
from score_lightning.rollout.trajectory import Trajectory

PROTOCOLS = ("joint", "pointwise")
READOUTS = ("sampled", "expected")


@dataclass(frozen=True)
class GroupEvaluation:
    """One query's K reports as the evaluator judged them."""

    parse: EvaluationParse  # reports 1..K (pointwise: each report's own evaluation, renumbered)
    depth: tuple[int, ...]  # per report: verification searches behind its scores
    process_ok: tuple[bool, ...]  # per report: its evaluation met the harness's process rules
    evaluations_valid: tuple[bool, ...]  # per evaluation (1 joint, K pointwise): its XML parsed completely
    complete: bool  # every evaluation reached every report it had to score, and none was truncated
    judged: tuple[bool, ...] = ()  # per report: a complete evaluation scored it (joint: all K share one)

    def report_valid(self, rid: int) -> bool:
        rep = self.parse.reports.get(rid)
        return rep is not None and rep.valid


def meets_process_rules(ev: EvaluationParse, num_reports: int, pc: ProcessConstraints) -> bool:
    """Every report 1..K has the sections the harness requires (always true when none is required)."""
    if not (pc.require_verification or pc.require_gap_analysis):
        return True
    for rid in range(1, num_reports + 1):
        rep = ev.reports.get(rid)
        if rep is None:
            return False
        if pc.require_verification and not rep.has_verification:
            return False
        if pc.require_gap_analysis and not rep.has_gap_analysis:
            return False
    return True


def _parse(traj: Trajectory, rubric: Rubric, num_reports: int, pc: ProcessConstraints, tokenizer,
           readout: str = "sampled") -> EvaluationParse:
    text = traj.model_text(tokenizer)
    if readout == "expected":
        text = with_values(text, [v for _, v in traj.value_readouts])
    return parse_evaluation(text, rubric, num_reports, require_verification=pc.require_verification,
                            require_gap_analysis=pc.require_gap_analysis)


def _complete(ev: EvaluationParse, traj: Trajectory, num_reports: int) -> bool:
    return not traj.truncated and ev.reaches_every_report(num_reports)


def group_evaluations(scoring: Sequence[Trajectory], rubrics: Sequence[Rubric], num_reports: int, protocol: str,
                      pc: ProcessConstraints, tokenizer, readout: str = "sampled") -> list[GroupEvaluation]:
    """One record per query from ``scoring`` (joint: one trajectory per query; pointwise: K per query, query-major),
    its scores read as ``readout`` says (``expected``: the trajectories must carry their value readouts)."""
    K = num_reports
    if protocol not in PROTOCOLS:
        raise ValueError(f"evaluator.scoring={protocol!r}: allowed {PROTOCOLS}")
    if readout not in READOUTS:
        raise ValueError(f"evaluator.score_readout={readout!r}: allowed {READOUTS}")
    per_query = 1 if protocol == "joint" else K
    if len(scoring) != per_query * len(rubrics):
        raise ValueError(f"{protocol} scoring: expected {per_query * len(rubrics)} evaluations for {len(rubrics)} "
                         f"queries, got {len(scoring)}")
    out = []
    for i, rubric in enumerate(rubrics):
        trajs = scoring[i * per_query:(i + 1) * per_query]
        if protocol == "joint":
            ev = _parse(trajs[0], rubric, K, pc, tokenizer, readout)
            ok = meets_process_rules(ev, K, pc)
            done = _complete(ev, trajs[0], K)
            out.append(GroupEvaluation(ev, (len(trajs[0].search_queries),) * K, (ok,) * K, (ev.valid,), done,
                                       (done,) * K))
            continue
        evs = [_parse(t, rubric, 1, pc, tokenizer, readout) for t in trajs]
        reports = {k: replace(ev.reports[1], report_id=k) for k, ev in enumerate(evs, 1) if 1 in ev.reports}
        merged = EvaluationParse(reports, valid=all(ev.valid for ev in evs),
                                 error=next((f"report {k}: {ev.error}" for k, ev in enumerate(evs, 1) if ev.error), ""),
                                 closed=all(ev.closed for ev in evs))
        judged = tuple(_complete(ev, t, 1) for ev, t in zip(evs, trajs))
        out.append(GroupEvaluation(merged, tuple(len(t.search_queries) for t in trajs),
                                   tuple(meets_process_rules(ev, 1, pc) for ev in evs), tuple(ev.valid for ev in evs),
                                   all(judged), judged))
    return out
