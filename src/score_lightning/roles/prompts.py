"""Chat messages for the three prompts of the shared actor: solve, choose a rubric, score.

The builders return ``[{"role", "content"}]`` lists; the caller applies the tokenizer's chat
template. System prompts are short and fixed (the CPU default model has a 1-2k token context);
everything that varies per step (query, rubric, harness constraints, scheduler hints) goes into
the user message, so a harness refresh changes only the user turn.
"""

from __future__ import annotations

from collections.abc import Sequence

from score_lightning.harness.state import HarnessState
from score_lightning.protocol import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    DIMENSIONS_CLOSE,
    DIMENSIONS_OPEN,
    EVALS_CLOSE,
    EVALS_OPEN,
    GAP_CLOSE,
    GAP_OPEN,
    OBS_CLOSE,
    OBS_OPEN,
    REPORT_CLOSE,
    SCORES_CLOSE,
    SCORES_OPEN,
    SEARCH_CLOSE,
    SEARCH_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
    VERIFICATION_CLOSE,
    VERIFICATION_OPEN,
)
from score_lightning.roles.cited_passages import CitedPassage, passages_block
from score_lightning.roles.evidence import EvidenceDoc
from score_lightning.roles.rubric import Rubric, format_weight

Message = dict[str, str]

#: The solver prompt's request for a final conclusion line (``solver.conclusion_line``).
CONCLUSION_INSTRUCTION = "- End the report with a line 'Conclusion: <your one-sentence answer>'.\n"

SOLVER_SYSTEM = (
    "You are a deep-research assistant. Answer the question from a document corpus.\n"
    f"- Think inside {THINK_OPEN}...{THINK_CLOSE}.\n"
    f"- To search, write one query as {SEARCH_OPEN}query{SEARCH_CLOSE} and stop; "
    f"results come back in {OBS_OPEN}...{OBS_CLOSE}. At most {{max_tool_calls}} searches.\n"
    f"- Finish with the report in {ANSWER_OPEN}...{ANSWER_CLOSE}. Back each claim with the id of a "
    "retrieved document in square brackets, e.g. [json.dumps]; cite only documents you retrieved.\n"
    + CONCLUSION_INSTRUCTION +
    "The report is scored on the rubric given with the question."
)

RUBRIC_SYSTEM = (
    "You are the evaluator. Before reports are written, choose the rubric that will judge "
    "deep-research reports on the given queries. You may think first, then output exactly one block:\n"
    f'{DIMENSIONS_OPEN}<dim name="NAME" weight="0.40"/>...{DIMENSIONS_CLOSE}\n'
    "Rules: exactly k distinct dimensions from the pool, must-include dimensions first, "
    "each weight within the bounds, weights summing to 1. Prefer dimensions that separate strong "
    "reports from weak ones for these queries."
)

SCORING_SYSTEM = (
    "You are the evaluator. Judge each numbered report against the rubric. You may first verify "
    f"claims: write {SEARCH_OPEN}query{SEARCH_CLOSE} and read the {OBS_OPEN}. Then output:\n"
    f'{EVALS_OPEN}<report id="1">{VERIFICATION_OPEN}claims checked against evidence{VERIFICATION_CLOSE}'
    f"{GAP_OPEN}what is missing or wrong{GAP_CLOSE}"
    f'{SCORES_OPEN}<score dim="NAME" value="7" reason="short reason"/>...{SCORES_CLOSE}{REPORT_CLOSE}'
    f"...{EVALS_CLOSE}\n"
    "One <report> per report id, one <score> per rubric dimension, integer values 0-10 (10 best). "
    "Unsupported claims and citations of documents that were never retrieved lose points."
)


#: One report per prompt (``evaluator.scoring=pointwise``): the same XML with a single ``<report id="1">``,
#: so one parser and one grammar serve both protocols.
POINTWISE_SCORING_SYSTEM = (
    "You are the evaluator. Judge the one report below against the rubric. You may first verify "
    f"claims: write {SEARCH_OPEN}query{SEARCH_CLOSE} and read the {OBS_OPEN}. Then output:\n"
    f'{EVALS_OPEN}<report id="1">{VERIFICATION_OPEN}claims checked against evidence{VERIFICATION_CLOSE}'
    f"{GAP_OPEN}what is missing or wrong{GAP_CLOSE}"
    f'{SCORES_OPEN}<score dim="NAME" value="7" reason="short reason"/>...{SCORES_CLOSE}{REPORT_CLOSE}'
    f"{EVALS_CLOSE}\n"
    "One <score> per rubric dimension, integer values 0-10 (10 best). "
    "Unsupported claims and citations of documents that were never retrieved lose points."
)

#: The line that shows, above a report, the ids its solver's searches returned (``evaluator.show_retrieved``).
RETRIEVED_PREFIX = "Retrieved by its searches:"


def retrieved_line(ids: Sequence[str] | None) -> str:
    """``Retrieved by its searches: [a] [b]`` (``none`` when the solver never searched)."""
    return f"{RETRIEVED_PREFIX} {' '.join(f'[{d}]' for d in ids) if ids else 'none'}"


def _line(dim: str, weight: float | None, state: HarnessState) -> str:
    label = dim if weight is None else f"{dim} (weight {format_weight(weight)})"
    definition = state.dimension_pool.get(dim, "")
    return f"- {label}: {definition}" if definition else f"- {label}"


def format_rubric(rubric: Rubric, state: HarnessState) -> str:
    """One line per dimension: ``- name (weight 0.40): definition`` (the item's own text when it has one)."""
    if rubric.texts:
        return "\n".join(f"- {d} (weight {format_weight(w)}): {t}" for d, w, t in zip(rubric.dims, rubric.weights, rubric.texts))
    return "\n".join(_line(d, w, state) for d, w in zip(rubric.dims, rubric.weights))


def format_constraints(state: HarnessState) -> str:
    """The dimension constraints as a short paragraph plus the pool with definitions."""
    dc = state.dimension_constraints
    must = ", ".join(dc.must_include) if dc.must_include else "none"
    pool = "\n".join(_line(name, None, state) for name in state.dimension_pool)
    return (
        f"Constraints: k = {dc.k} dimensions; must include: {must}; "
        f"each weight between {dc.weight_min:g} and {dc.weight_max:g} (a must-include dimension: any weight "
        "up to 1); weights sum to 1.\n"
        f"Dimension pool:\n{pool}"
    )


def format_process_rules(state: HarnessState) -> str:
    """The harness process rules for scoring, as imperative lines."""
    pc = state.process_constraints
    lines = []
    if pc.min_number_of_tool_call > 0:
        n = pc.min_number_of_tool_call
        lines.append(f"- Make at least {n} search{'es' if n > 1 else ''} to verify claims before scoring.")
    if pc.require_verification:
        lines.append(f"- Every report needs a non-empty {VERIFICATION_OPEN} section.")
    if pc.require_gap_analysis:
        lines.append(f"- Every report needs a non-empty {GAP_OPEN} section.")
    if pc.citation_cross_check:
        lines.append("- Cross-check that each cited [doc_id] was retrieved and supports its sentence.")
    return "Process rules:\n" + "\n".join(lines) if lines else "Process rules: none."


def _notes(state: HarnessState) -> str:
    return f"\nHarness notes: {state.notes.strip()}" if state.notes.strip() else ""


def solver_messages(query: str, rubric: Rubric, state: HarnessState, max_tool_calls: int,
                    conclusion_line: bool = True) -> list[Message]:
    """System: the tag protocol and budget. User: the question and the rubric it will be judged on.

    ``conclusion_line=False`` drops the request for a final ``Conclusion:`` line (the consistency
    reward then relies on ``extract_conclusion``'s fallback rules: last paragraph or sentence).
    """
    system = SOLVER_SYSTEM.format(max_tool_calls=max_tool_calls)
    if not conclusion_line:
        system = system.replace(CONCLUSION_INSTRUCTION, "")
    user = f"Question: {query.strip()}\n\nRubric:\n{format_rubric(rubric, state)}"
    if state.process_constraints.citation_cross_check:
        user += "\nCitations will be checked against the documents you retrieved."
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def rubric_messages(
    queries: Sequence[str],
    state: HarnessState,
    required: Sequence[str] = (),
    avoided: Sequence[str] = (),
    explore: Sequence[str] = (),
    evidence: Sequence[Sequence[EvidenceDoc]] | None = None,
) -> list[Message]:
    """System: the rubric format and rules. User: queries, harness constraints, scheduler hints, notes.

    ``evidence`` (one document list per query) is the initial evidence D_q^0 = R(q): the evaluation
    environment is E_q = Harness(q, D_q^0, S), so the evaluator chooses its rubric knowing what the
    corpus returns for each query: each document's id with its title or opening words
    (:mod:`~score_lightning.roles.evidence`; the passages themselves would crowd the prompt).
    """
    lines = []
    for i, q in enumerate(queries, 1):
        lines.append(f"{i}. {q.strip()}")
        if evidence is not None and i - 1 < len(evidence) and evidence[i - 1]:
            lines.append("   initial evidence:")
            lines.extend(f"   - {d.line()}" for d in evidence[i - 1])
    listed = "\n".join(lines)
    hints = []
    if required:
        hints.append(f"include: {', '.join(required)}")
    if avoided:
        hints.append(f"avoid: {', '.join(avoided)}")
    if explore:
        hints.append(f"consider trying: {', '.join(explore)}")
    hint_text = f"\nScheduler hints: {'; '.join(hints)}." if hints else ""
    user = f"Queries:\n{listed}\n\n{format_constraints(state)}{hint_text}{_notes(state)}"
    return [{"role": "system", "content": RUBRIC_SYSTEM}, {"role": "user", "content": user}]


def scoring_messages(query: str, reports: Sequence[str], rubric: Rubric, state: HarnessState,
                     sources: Sequence[Sequence[str]] | None = None, pointwise: bool = False,
                     cited: Sequence[Sequence[CitedPassage]] | None = None) -> list[Message]:
    """System: the scoring XML. User: query, rubric, process rules, notes and reports numbered 1..K.

    ``sources`` (one id list per report, ``evaluator.show_retrieved``) puts the ids each report's searches
    returned above it, so the citation cross-check is something the evaluator can actually do.
    ``cited`` (one list per report, ``evaluator.show_passages``) puts the passages it cites below it
    (:mod:`~score_lightning.roles.cited_passages`), so whether a finding says what its source says can be read.
    ``pointwise``: one report per prompt (``evaluator.scoring=pointwise``), with its own system prompt.
    """
    if pointwise and len(reports) != 1:
        raise ValueError(f"pointwise scoring shows one report per prompt, got {len(reports)}")
    if cited is not None and len(cited) != len(reports):
        raise ValueError(f"one cited-passage list per report: {len(cited)} lists for {len(reports)} reports")
    shown = [f"{retrieved_line(sources[i])}\n{r.strip()}" if sources is not None else r.strip()
             for i, r in enumerate(reports)]
    if cited is not None:
        shown = [f"{r}\n{passages_block(cited[i])}" for i, r in enumerate(shown)]
    body = "\n\n".join(f"[Report {i}]\n{r}" for i, r in enumerate(shown, 1))
    head = "Report (id 1)" if pointwise else f"Reports (ids 1..{len(reports)})"
    user = (
        f"Question: {query.strip()}\n\nRubric:\n{format_rubric(rubric, state)}\n\n"
        f"{format_process_rules(state)}{_notes(state)}\n\n"
        f"{head}:\n\n{body}"
    )
    return [{"role": "system", "content": POINTWISE_SCORING_SYSTEM if pointwise else SCORING_SYSTEM},
            {"role": "user", "content": user}]
