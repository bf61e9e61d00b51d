"""Stage 2: the environment's initial evidence, the K solver rollouts per query, and the scoring.

All three run the same multi-turn agent loop (:func:`~score_lightning.rollout.agent.run_agent`),
so solver and evaluator searches share one retriever, one observation format and one token
bookkeeping. Query ``i``'s K solver trajectories are contiguous (rows ``i*K .. i*K+K-1``), the
layout GRPO's group advantages expect.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from score_lightning import protocol as P
from score_lightning.harness.state import HarnessState
from score_lightning.retrieval.base import RetrievalError, Retriever, hits_or_failed
from score_lightning.roles.cited_passages import cited_passages, corpus_texts, passage_texts
from score_lightning.roles.evidence import EvidenceDoc, evidence_from_hits
from score_lightning.roles.prompts import scoring_messages
from score_lightning.roles.rubric import Rubric
from score_lightning.rollout.agent import AgentConfig, run_agent
from score_lightning.rollout.chat import encode_chat, truncate_text
from score_lightning.rollout.constrained import ScoringConstraint, text_added_tokens
from score_lightning.rollout.engine import RolloutEngine
from score_lightning.rollout.trajectory import Trajectory
from score_lightning.rollout.workflows import SOLVER_WORKFLOWS, rollout_metas

if TYPE_CHECKING:
    from score_lightning.config.schema import EvaluatorConfig, SolverConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RolloutSettings:
    """Budgets of the solver and scoring loops (``solver.*`` / ``evaluator.*`` in the config)."""

    num_rollouts: int  # K
    max_prompt_tokens: int  # the solver's (and rubric's) prompt cap
    solver: AgentConfig
    scoring: AgentConfig
    max_report_tokens: int  # each report is cut to this many tokens inside the scoring prompt
    conclusion_line: bool  # solver.conclusion_line: ask the solver to end with "Conclusion: ..."
    agent: str  # solver.agent: the registered workflow (rollout/workflows.py): react | mams | rubricem
    options: Any  # that workflow's own budgets (SolverWorkflow.options_from_solver; mams: solver.mams.*), or None
    constrained_scoring: bool  # evaluator.constrained_scoring: scoring turns held to the rubric's XML
    constrained_max_chars: dict | None  # evaluator.constrained_max_chars: caps of its free-text fields
    scoring_protocol: str  # evaluator.scoring: joint (one evaluation of all K) | pointwise (one per report)
    show_retrieved: bool  # evaluator.show_retrieved: each report shown with the ids its searches returned
    scoring_max_prompt_tokens: int | None  # evaluator.max_prompt_tokens (None: max_prompt_tokens)
    score_readout: str  # evaluator.score_readout: sampled (the written value) | expected (E[value])
    show_passages: bool  # evaluator.show_passages: each report shown with the passages it cites
    passage_tokens: int  # evaluator.passage_tokens: each cited passage cut to this many tokens
    max_cited_passages: int  # evaluator.max_cited_passages: at most this many per report (first cited first)


def rollout_settings(solver: "SolverConfig", evaluator: "EvaluatorConfig") -> RolloutSettings:
    """The solver's and the scoring loops' budgets and sampling, from the ``solver`` and ``evaluator`` nodes (the
    scoring loop searches with the solver's ``topk``); the workflow ``solver.agent`` names builds its own options
    from the solver node (``SolverWorkflow.options_from_solver``)."""
    s, e = solver, evaluator
    solver_loop = AgentConfig(
        max_tool_calls=int(s.max_tool_calls), max_response_tokens=int(s.max_response_tokens),
        max_observation_tokens=int(s.max_observation_tokens), topk=int(s.topk),
        temperature=float(s.temperature), top_p=float(s.top_p), finish_tag=P.ANSWER_CLOSE,
    )
    scoring = AgentConfig(
        max_tool_calls=int(e.max_tool_calls), max_response_tokens=int(e.max_response_tokens),
        max_observation_tokens=int(e.max_observation_tokens), topk=int(s.topk),
        temperature=scoring_temperature(e), finish_tag=P.EVALS_CLOSE, allow_search=int(e.max_tool_calls) > 0,
        observations_in_budget=False,  # evaluator.max_response_tokens counts what it writes (budgets.py)
    )
    agent = str(s.agent)
    return RolloutSettings(int(s.num_rollouts), int(s.max_prompt_tokens), solver_loop, scoring,
                           int(e.max_report_tokens), bool(s.conclusion_line), agent,
                           SOLVER_WORKFLOWS.get(agent).options_from_solver(s), bool(e.constrained_scoring),
                           constrained_max_chars(e), str(e.scoring), bool(e.show_retrieved), int(e.max_prompt_tokens),
                           str(e.score_readout), bool(e.show_passages), int(e.passage_tokens),
                           int(e.max_cited_passages))


def constrained_max_chars(evaluator: "EvaluatorConfig") -> dict[str, int] | None:
    """``evaluator.constrained_max_chars`` as a plain dict (``None``: the grammar's defaults)."""
    caps = evaluator.constrained_max_chars
    return {str(k): int(v) for k, v in caps.items()} if caps else None


def scoring_temperature(evaluator: "EvaluatorConfig") -> float:
    """``evaluator.scoring_temperature``, else ``evaluator.temperature``. Scoring tokens are never trained
    (REINFORCE trains the rubric), so their temperature only trades judge noise against diversity; 0 is greedy."""
    t = evaluator.scoring_temperature
    return float(evaluator.temperature if t is None else t)


def initial_evidence(retriever: Retriever, queries: Sequence[str], topk: int) -> tuple[list[list[EvidenceDoc]], int]:
    """D_q^0 = R(q): the top documents per query (ids with titles), and 1 if the retrieval failed (else 0).

    It grounds the rubric prompt (E_q = Harness(q, D_q^0, S)) and doubles as a per-step retrieval
    health probe that does not depend on whether the policy chose to search. A retriever that fails query by
    query (MCP) leaves the others their documents; the failed ones get none.
    """
    try:
        return evidence_from_hits(retriever.search(list(queries), topk)), 0
    except RetrievalError as exc:
        log.warning("initial retrieval failed: %s", exc)
        return evidence_from_hits([h or [] for h in hits_or_failed(exc, len(queries))]), 1


def solver_rollouts(engine: RolloutEngine, tokenizer, retriever: Retriever, queries: Sequence[str],
                    rubrics: Sequence[Rubric], state: HarnessState, settings: RolloutSettings,
                    guidance: Sequence[str] | None = None) -> list[Trajectory]:
    """K trajectories per query, each conditioned on its query's rubric; query-major order.

    ``settings.agent`` names the registered workflow that rolls them out (:data:`~score_lightning.rollout.workflows.
    SOLVER_WORKFLOWS`); ``guidance``, per query, is what a workflow with a reflection memory shows (rubricem)."""
    workflow = SOLVER_WORKFLOWS.get(settings.agent)
    return workflow.rollouts(engine, tokenizer, retriever, queries, rubrics, state, settings, settings.options,
                             guidance, rollout_metas(len(queries), settings.num_rollouts))


def report_citations(tokenizer, retriever, reports: Sequence[str], retrieved: Sequence[Sequence[str]] | None,
                     shown: Sequence[Mapping[str, str]] | None, settings: RolloutSettings):
    """Per report, the passages it cites as ``evaluator.show_passages`` shows them (None when it is off): the text
    from the retriever's corpus, else from what the report's searches showed, cut to ``evaluator.passage_tokens``;
    flagged when its searches did not return it (``retrieved``: per report, the ids they returned)."""
    if not settings.show_passages:
        return None
    corpus = corpus_texts(retriever)
    if corpus is None and shown is None:
        raise ValueError("evaluator.show_passages: the retriever has no local corpus and no search texts were given")
    cut = lambda text: truncate_text(tokenizer, text, settings.passage_tokens)  # noqa: E731
    return [cited_passages(r, retrieved[k] if retrieved is not None else (), passage_texts(
        corpus, shown[k] if shown is not None else None), settings.max_cited_passages, cut)
        for k, r in enumerate(reports)]


def scoring_rollouts(engine: RolloutEngine, tokenizer, retriever: Retriever, queries: Sequence[str],
                     reports: Sequence[Sequence[str | None]], rubrics: Sequence[Rubric], state: HarnessState,
                     settings: RolloutSettings, sources: Sequence[Sequence[Sequence[str]]] | None = None,
                     shown: Sequence[Sequence[Mapping[str, str]]] | None = None) -> list[Trajectory]:
    """The evaluations of each query's K reports under its rubric (``None``: no report written).

    ``evaluator.scoring=joint``: one trajectory per query over all its reports. ``pointwise``: one per
    report (query-major), each prompt holding the query, the rubric and that report; all of them run as
    one batch. ``sources`` (per query, per report: the ids its searches returned) is shown when
    ``evaluator.show_retrieved`` is on. With ``evaluator.show_passages`` each report is shown with the passages it
    cites (:func:`report_citations`; ``shown``: per query, per report, the passages its searches showed, for a
    retriever without a local corpus). :func:`~score_lightning.step.evaluations.group_evaluations` reads either back.
    With ``evaluator.score_readout=expected`` the engine also reads each score's expected value (``value_readouts``).
    """
    prompts, constraints = [], []
    pc = state.process_constraints
    pointwise = settings.scoring_protocol == "pointwise"
    added = text_added_tokens(tokenizer) if settings.constrained_scoring else {}
    for i, (q, group, rubric) in enumerate(zip(queries, reports, rubrics)):
        reports_shown = [truncate_text(tokenizer, r if r else "(no report)", settings.max_report_tokens) for r in group]
        # callers without sources (preference pairs: texts, no trajectories) show no retrieved line
        ids = [list(s) for s in sources[i]] if (settings.show_retrieved and sources is not None) else None
        cited = report_citations(tokenizer, retriever, reports_shown, sources[i] if sources is not None else None,
                                 shown[i] if shown is not None else None, settings)
        batches = [([r], None if ids is None else [ids[k]], None if cited is None else [cited[k]])
                   for k, r in enumerate(reports_shown)] if pointwise else [(reports_shown, ids, cited)]
        for shown_reports, shown_ids, shown_cited in batches:
            msgs = scoring_messages(q, shown_reports, rubric, state, shown_ids, pointwise=pointwise, cited=shown_cited)
            prompts.append(encode_chat(tokenizer, msgs, settings.scoring_max_prompt_tokens or settings.max_prompt_tokens,
                                       key="evaluator.max_prompt_tokens"))
            if settings.constrained_scoring:
                constraints.append(ScoringConstraint(rubric.dims, len(shown_reports), pc.require_verification,
                                                     pc.require_gap_analysis, added, settings.constrained_max_chars))
    agent = replace(settings.scoring, value_readout=settings.score_readout == "expected")
    return run_agent(engine, tokenizer, prompts, retriever, agent,
                     constraints=constraints if settings.constrained_scoring else None)
