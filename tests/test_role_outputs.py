"""Parsers and prompts of the evaluator's scoring and the solver's answer: valid and invalid examples with their
reasons, the answer's conclusion, and the roles' prompts. Rubrics: ``test_roles.py``."""

from __future__ import annotations

from score_lightning.harness.state import DEFAULT_DIMENSION_POOL, HarnessState
from score_lightning.roles.answer import extract_conclusion, parse_answer
from score_lightning.roles.evaluation import parse_evaluation
from score_lightning.roles.prompts import (
    RUBRIC_SYSTEM,
    SCORING_SYSTEM,
    SOLVER_SYSTEM,
    rubric_messages,
    scoring_messages,
    solver_messages,
)
from score_lightning.roles.rubric import Rubric, fallback_rubric, parse_rubric

STATE = HarnessState()  # k=4, must_include factual_support, weights in [0.1, 0.5]
RUB = Rubric(("factual_support", "insight"), (0.6, 0.4))


def report_xml(rid, scores: dict[str, str], ver: str | None = "checked", gap: str | None = "none") -> str:
    parts = [f'<report id="{rid}">']
    if ver is not None:
        parts.append(f"<verification>{ver}</verification>")
    if gap is not None:
        parts.append(f"<gap_analysis>{gap}</gap_analysis>")
    parts.append("<scores>" + "".join(f'<score dim="{d}" value="{v}" reason="r"/>' for d, v in scores.items()))
    parts.append("</scores></report>")
    return "".join(parts)


def evals_xml(*reports: str) -> str:
    return "<report_evaluations>" + "".join(reports) + "</report_evaluations>"


def test_parse_evaluation_valid_and_matrix():
    text = "<think>let me check</think><search>json</search><observation>doc</observation>" + evals_xml(
        report_xml(1, {"factual_support": "7", "insight": "4", "unknown_dim": "9"}),
        report_xml(2, {"insight": "10", "factual_support": "0"}, ver=None, gap=None),
    )
    p = parse_evaluation(text, RUB, 2)
    assert p.valid and p.error == ""
    assert p.reports[1].scores == {"factual_support": 0.7, "insight": 0.4}  # unknown dim ignored
    assert p.reports[1].has_verification and p.reports[1].has_gap_analysis
    assert not p.reports[2].has_verification and not p.reports[2].has_gap_analysis
    assert p.score_matrix(RUB, 2) == [[0.7, 0.4], [0.0, 1.0]]
    # 3 reports requested: third row zeros, parse invalid
    p3 = parse_evaluation(text, RUB, 3)
    assert not p3.valid and p3.error == "missing report 3"
    assert p3.score_matrix(RUB, 3) == [[0.7, 0.4], [0.0, 1.0], [0.0, 0.0]]


def test_parse_evaluation_single_quotes_any_order_and_decimals():
    text = "<report_evaluations><report id='1'><scores><score value='7.5' dim='factual_support'/>" \
           "<score reason=\"has > inside\" dim=\"insight\" value=\"3\"/></scores></report></report_evaluations>"
    p = parse_evaluation(text, RUB, 1)
    assert p.valid and p.reports[1].scores == {"factual_support": 0.75, "insight": 0.3}


def test_parse_evaluation_invalid_cases():
    good1 = report_xml(1, {"factual_support": "7", "insight": "4"})
    cases = [
        (evals_xml(good1, report_xml(2, {"factual_support": "11", "insight": "4"})), {},
         "report 2: score 11 for 'factual_support' outside 0..10"),
        (evals_xml(good1, report_xml(2, {"factual_support": "-1", "insight": "4"})), {},
         "report 2: score -1 for 'factual_support' outside 0..10"),
        (evals_xml(good1, report_xml(2, {"factual_support": "seven", "insight": "4"})), {},
         "report 2: score 'seven' for 'factual_support' is not a number"),
        (evals_xml(good1, report_xml(2, {"factual_support": "7"})), {}, "report 2: missing score for 'insight'"),
        (evals_xml(good1, report_xml(2, {"factual_support": "7", "insight": "4"}, ver=None)),
         {"require_verification": True}, "report 2: missing <verification>"),
        (evals_xml(good1, report_xml(2, {"factual_support": "7", "insight": "4"}, ver="  ")),
         {"require_verification": True}, "report 2: missing <verification>"),
        (evals_xml(good1, report_xml(2, {"factual_support": "7", "insight": "4"}, gap=None)),
         {"require_gap_analysis": True}, "report 2: missing <gap_analysis>"),
        (evals_xml(good1), {}, "missing report 2"),
        (evals_xml(good1, good1.replace('id="1"', 'id="2"'))[: -len("</report_evaluations>")], {},
         "missing </report_evaluations>"),
        (good1 + good1.replace('id="1"', 'id="2"'), {}, "missing <report_evaluations>"),
        (evals_xml(good1, good1, good1.replace('id="1"', 'id="2"')), {}, "duplicate report id 1"),
        (evals_xml(good1, good1.replace('id="1"', 'id="x"')), {}, "report with bad id 'x'"),
        (evals_xml(good1, good1.replace('id="1"', 'id="2"').replace("</report>", "")), {}, "report 2: missing </report>"),
        (evals_xml(good1, good1.replace('id="1"', 'id="2"').replace("</scores>", "")), {}, "report 2: missing </scores>"),
    ]
    for text, kwargs, expected in cases:
        p = parse_evaluation(text, RUB, 2, **kwargs)
        assert not p.valid and p.error == expected, (expected, p.error)


def test_parse_evaluation_out_of_range_is_clipped_and_partial_reports_kept():
    text = evals_xml(report_xml(1, {"factual_support": "12", "insight": "5"}))[: -len("</report_evaluations>")]
    p = parse_evaluation(text, RUB, 1)
    assert not p.valid and p.error == "missing </report_evaluations>"
    assert p.reports[1].scores == {"factual_support": 1.0, "insight": 0.5}
    assert not p.reports[1].valid and "outside 0..10" in p.reports[1].error


def test_parse_evaluation_uses_last_block():
    draft = evals_xml(report_xml(1, {"factual_support": "1", "insight": "1"}))
    final = evals_xml(report_xml(1, {"factual_support": "9", "insight": "8"}))
    p = parse_evaluation(f"<think>{draft}</think>{final}", RUB, 1)
    assert p.valid and p.score_matrix(RUB, 1) == [[0.9, 0.8]]


def test_parse_evaluation_ids_outside_range_ignored():
    good = [report_xml(i, {"factual_support": "5", "insight": "5"}) for i in (1, 2, 3)]
    p = parse_evaluation(evals_xml(*good), RUB, 2)
    assert p.valid and set(p.reports) == {1, 2}


# ============================================================================ answer

ANSWER = "JSON text is produced by json.dumps [json.dumps]. Conclusion: use json.dumps [json.dumps]."


def test_parse_answer_valid_trajectory():
    text = f"<think>plan</think><search>json</search><observation>[json.dumps] doc</observation><answer> {ANSWER} </answer>"
    p = parse_answer(text, require_citation=True)
    assert p.valid and p.reason == "" and p.answer == ANSWER and p.cited_ids == ("json.dumps",)


def test_parse_answer_invalid_cases():
    cases = [
        ("no answer", {}, "no <answer> block"),
        (f"<answer>{ANSWER}", {}, "missing </answer>"),
        (f"{ANSWER}</answer>", {}, "</answer> without <answer>"),
        (f"<answer>{ANSWER}</answer><answer>second try", {}, "missing </answer> after the last <answer>"),
        (f"<answer>{ANSWER}</answer>", {"truncated": True}, "truncated"),
        (f"<answer>{ANSWER} <search>more</search></answer>", {}, "nested <search> inside answer"),
        (f"<answer>{ANSWER} <observation>x</observation></answer>", {}, "nested <observation> inside answer"),
        (f"<answer>draft <answer>{ANSWER}</answer>", {}, "nested <answer> inside answer"),
        ("<answer>  too short  here </answer>", {}, "answer too short (12 < 20 non-space chars)"),
        ("<answer>A long enough answer without any citation.</answer>", {"require_citation": True}, "no citation"),
    ]
    for text, kwargs, expected in cases:
        p = parse_answer(text, **kwargs)
        assert not p.valid and p.reason == expected, (expected, p.reason)


def test_parse_answer_last_block_and_options():
    text = "<answer>first answer, long enough to pass [a]</answer> more <answer>second [b] cites [c] then [b] again</answer>"
    p = parse_answer(text)
    assert p.valid and p.answer.startswith("second") and p.cited_ids == ("b", "c")
    assert parse_answer("<answer>short but ok</answer>", min_chars=5).valid
    assert not parse_answer("<answer>short but ok</answer>", min_chars=50).valid
    # citations are collected even when invalid
    assert parse_answer("<answer>[x] [y]</answer>").cited_ids == ("x", "y")


def test_extract_conclusion_rules():
    assert extract_conclusion(ANSWER) == "use json.dumps."
    assert extract_conclusion("Intro. In conclusion, prefer pathlib [pathlib.Path].") == "prefer pathlib."
    assert extract_conclusion("Some text.\nOverall, it works.\nMore detail follows here.") == (
        "it works. More detail follows here."
    )
    assert extract_conclusion("**Conclusion:** Use it.") == "Use it."
    # the last marker wins
    assert extract_conclusion("Conclusion: first.\n\nConclusion: second [d].") == "second."
    # rule 2: last non-empty paragraph
    assert extract_conclusion("First para. Two.\n\nLast para [x] here.\nStill last.\n\n  \n") == (
        "Last para here. Still last."
    )
    # rule 3: last sentence of a single paragraph
    assert extract_conclusion("One. Two [a]! Three is final?") == "Three is final?"
    # a marker with nothing after it falls through to rule 3
    assert extract_conclusion("Alpha. Beta. Conclusion:") == "Conclusion:"
    # not a marker: mid-sentence "in conclusion"
    assert extract_conclusion("We stated in conclusion nothing. Final sentence.") == "Final sentence."
    assert extract_conclusion("") == "" and extract_conclusion("   ") == ""


# ============================================================================ prompts


def _words(text: str) -> int:
    return len(text.split())


def test_system_prompts_are_short():
    for system in (SOLVER_SYSTEM, RUBRIC_SYSTEM, SCORING_SYSTEM):
        assert _words(system) <= 120


def test_solver_messages():
    r = fallback_rubric(STATE)
    msgs = solver_messages("How to write JSON?", r, STATE, max_tool_calls=3)
    assert [m["role"] for m in msgs] == ["system", "user"]
    sys_, user = msgs[0]["content"], msgs[1]["content"]
    for tag in ("<think>", "<search>", "<observation>", "<answer>", "Conclusion:", "[json.dumps]", "3 searches"):
        assert tag in sys_
    assert "How to write JSON?" in user
    for d in r.dims:
        assert f"{d} (weight 0.25): {STATE.dimension_pool[d]}" in user


def test_rubric_messages_show_constraints_and_hints():
    s = HarnessState.from_dict({"notes": "Favour verification.", "dimension_constraints": {"k": 3}})
    msgs = rubric_messages(["q one", "q two"], s, required=["insight"], avoided=["readability"], explore=["conciseness"])
    user = msgs[1]["content"]
    assert "1. q one" in user and "2. q two" in user
    assert "k = 3" in user and "must include: factual_support" in user and "between 0.1 and 0.5" in user
    for name, definition in DEFAULT_DIMENSION_POOL.items():
        assert f"- {name}: {definition}" in user
    assert "include: insight" in user and "avoid: readability" in user and "conciseness" in user
    assert "Favour verification." in user
    assert "Scheduler hints" not in rubric_messages(["q"], s)[1]["content"]


def test_scoring_messages_number_reports_and_rules():
    s = HarnessState.from_dict({"process_constraints": {"require_gap_analysis": True, "citation_cross_check": True,
                                                        "min_number_of_tool_call": 2}})
    msgs = scoring_messages("q?", ["report A", "report B", "report C"], RUB, s)
    user = msgs[1]["content"]
    assert user.index("[Report 1]\nreport A") < user.index("[Report 2]\nreport B") < user.index("[Report 3]\nreport C")
    assert "at least 2 searches" in user and "<verification>" in user and "<gap_analysis>" in user
    assert "Cross-check" in user and "factual_support (weight 0.60)" in user


def test_prompt_format_examples_parse():
    """The formats shown to the model are the formats the parsers accept."""
    assert parse_rubric(RUBRIC_SYSTEM, STATE).error == "unknown dimension 'NAME'"
    p = parse_evaluation(SCORING_SYSTEM, Rubric(("NAME",), (1.0,)), 1, require_verification=True, require_gap_analysis=True)
    assert p.valid and p.reports[1].scores == {"NAME": 0.7}
