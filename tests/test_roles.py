"""Parsers and prompts of the solver and evaluator roles: valid and invalid examples with their reasons."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from score_lightning.harness.state import DEFAULT_DIMENSION_POOL, HarnessState, HarnessStateError
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
from score_lightning.roles.rubric import Rubric, fallback_rubric, parse_rubric, rubric_token_span

STATE = HarnessState()  # k=4, must_include factual_support, weights in [0.1, 0.5]


def dims_xml(*pairs: tuple[str, str]) -> str:
    return "<dimensions>" + "".join(f'<dim name="{n}" weight="{w}"/>' for n, w in pairs) + "</dimensions>"


GOOD = (("factual_support", "0.4"), ("insight", "0.2"), ("readability", "0.2"), ("conciseness", "0.2"))

# ============================================================================ rubric


def test_parse_rubric_valid_with_junk_and_mixed_quotes():
    text = (
        "<think>pick four</think>\n<dimensions>\n"
        '  <dim name="factual_support" weight="0.40"/>\n'
        "  <dim weight='0.2' name='insight' />\n"
        '  <dim name="readability" weight=0.2/>\n'
        '  <dim name="conciseness" weight="0.2"></dim>\n'
        "</dimensions> trailing words"
    )
    p = parse_rubric(text, STATE)
    assert p.valid and p.error == ""
    assert p.rubric == Rubric(("factual_support", "insight", "readability", "conciseness"), (0.4, 0.2, 0.2, 0.2))
    assert p.rubric.as_dict()["insight"] == 0.2


def test_parse_rubric_constraint_errors_keep_the_rubric():
    cases = {
        "k=3 but harness requires 4": GOOD[:3],
        "weight 0.6 > weight_max 0.5": (("factual_support", "0.1"), ("insight", "0.6"), ("readability", "0.15"),
                                         ("conciseness", "0.15")),
        "weight 0.05 < weight_min 0.1": (("factual_support", "0.5"), ("insight", "0.05")) + GOOD[2:],
        "unknown dimension 'foo'": GOOD[:3] + (("foo", "0.2"),),
        "must_include 'factual_support' missing": (("evidence_coverage", "0.4"),) + GOOD[1:],
        "duplicate dimension 'insight'": GOOD[:3] + (("insight", "0.2"),),
        "weights sum to 1.30, need 1±0.05": (("factual_support", "0.4"), ("insight", "0.3"),
                                               ("readability", "0.3"), ("conciseness", "0.3")),
    }
    for expected, pairs in cases.items():
        p = parse_rubric(dims_xml(*pairs), STATE)
        assert not p.valid
        assert p.error.startswith(expected), (expected, p.error)
        assert p.rubric is not None and p.rubric.dims == tuple(n for n, _ in pairs)


def test_parse_rubric_tolerances():
    ok = lambda pairs: parse_rubric(dims_xml(*pairs), STATE).valid  # noqa: E731
    assert ok((("factual_support", "0.26"),) + tuple((d, "0.26") for d in ("insight", "readability", "conciseness")))
    assert ok((("factual_support", "0.24"),) + tuple((d, "0.24") for d in ("insight", "readability", "conciseness")))
    assert not ok((("factual_support", "0.265"),) + tuple((d, "0.265") for d in ("insight", "readability", "conciseness")))
    # weight bound tolerance 1e-6 on a chosen dimension (sum 0.1667 * 3 + 0.5000005 = 1.0001)
    rest = tuple((d, "0.1667") for d in ("factual_support", "readability", "conciseness"))
    assert ok((("insight", "0.5000005"),) + rest)
    assert not ok((("insight", "0.500002"),) + rest)


def test_parse_rubric_per_listing_4_must_include_is_exempt_from_the_weight_bounds():
    """The bounds [0.1, 0.5] apply to the k - 1 chosen dimensions; the primary must-include one may weigh
    anything in (0, 1] (the paper's Listing 4)."""
    heavy = (("factual_support", "0.7"), ("insight", "0.1"), ("readability", "0.1"), ("conciseness", "0.1"))
    light = (("factual_support", "0.05"), ("insight", "0.35"), ("readability", "0.3"), ("conciseness", "0.3"))
    assert parse_rubric(dims_xml(*heavy), STATE).valid and parse_rubric(dims_xml(*light), STATE).valid
    zero = (("factual_support", "0"), ("insight", "0.4"), ("readability", "0.3"), ("conciseness", "0.3"))
    assert parse_rubric(dims_xml(*zero), STATE).error == "weight 0 of must-include 'factual_support' outside (0, 1]"
    chosen = (("factual_support", "0.4"), ("insight", "0.05"), ("readability", "0.3"), ("conciseness", "0.25"))
    assert parse_rubric(dims_xml(*chosen), STATE).error == "weight 0.05 < weight_min 0.1 ('insight')"


def test_weight_sum_is_a_config_option_and_unchecked_weights_are_normalised():
    pairs = (("factual_support", "0.4"), ("insight", "0.3"), ("readability", "0.3"), ("conciseness", "0.3"))
    assert parse_rubric(dims_xml(*pairs), STATE).error == "weights sum to 1.30, need 1±0.05"
    assert parse_rubric(dims_xml(*pairs), STATE, weight_sum_tol=0.5).valid
    p = parse_rubric(dims_xml(*pairs), STATE, weight_sum_tol=None)
    assert p.valid and p.rubric.dims == tuple(n for n, _ in pairs)
    assert p.rubric.weights == pytest.approx((0.4 / 1.3, 0.3 / 1.3, 0.3 / 1.3, 0.3 / 1.3))
    # the bounds are checked on the weights as written, before normalising
    bad = (("factual_support", "0.4"), ("insight", "0.6"), ("readability", "0.3"), ("conciseness", "0.3"))
    assert parse_rubric(dims_xml(*bad), STATE, weight_sum_tol=None).error == "weight 0.6 > weight_max 0.5 ('insight')"


def test_parse_rubric_format_errors_have_no_rubric():
    body = dims_xml(*GOOD)
    cases = {
        "missing </dimensions>": body[: -len("</dimensions>")],
        "missing <dimensions>": "no rubric here",
        "no <dim> entries": "<dimensions> </dimensions>",
        "malformed <dim> element": '<dimensions><dim name="insight" weight="0.2"</dimensions>',
        "<dim> without name": '<dimensions><dim weight="0.2"/></dimensions>',
        "dimension 'insight' has no weight": '<dimensions><dim name="insight"/></dimensions>',
        "weight '40%' of 'insight' is not a number": '<dimensions><dim name="insight" weight="40%"/></dimensions>',
        "weight 'nan' of 'insight' is not a number": '<dimensions><dim name="insight" weight="nan"/></dimensions>',
    }
    for expected, text in cases.items():
        p = parse_rubric(text, STATE)
        assert (p.rubric, p.valid, p.error) == (None, False, expected), text


def test_parse_rubric_takes_first_complete_block():
    first, second = dims_xml(*GOOD), dims_xml(*GOOD[:3])
    assert parse_rubric(first + second, STATE).valid
    assert parse_rubric(second + first, STATE).error.startswith("k=3")
    # an unclosed opening before the real block: the block starts at the last <dimensions> before the close
    assert parse_rubric("<dimensions> draft " + first, STATE).valid


def test_to_xml_format_and_round_trip():
    r = Rubric(("factual_support", "insight"), (0.4, 0.6))
    assert r.to_xml() == '<dimensions><dim name="factual_support" weight="0.40"/><dim name="insight" weight="0.60"/></dimensions>'
    odd = Rubric(("factual_support", "insight", "readability"), (1 / 3, 1 / 3, 1 - 2 / 3))
    state3 = HarnessState.from_dict({"dimension_constraints": {"k": 3}})
    p = parse_rubric(odd.to_xml(), state3)
    assert p.valid and p.rubric == odd  # exact floats survive the trip


def test_rubric_length_mismatch_raises():
    try:
        Rubric(("a", "b"), (1.0,))
    except ValueError:
        return
    raise AssertionError("Rubric accepted 2 dims with 1 weight")


def test_fallback_rubric_default_and_must_include_order():
    r = fallback_rubric(STATE)
    assert r == Rubric(("factual_support", "evidence_coverage", "citation_grounding", "contradiction_handling"),
                       (0.25, 0.25, 0.25, 0.25))
    s = HarnessState.from_dict({"dimension_constraints": {"k": 3, "must_include": ["insight", "factual_support"],
                                                          "weight_min": 0.2, "weight_max": 0.4}})
    r = fallback_rubric(s)
    assert r.dims == ("insight", "factual_support", "evidence_coverage")
    assert parse_rubric(r.to_xml(), s).valid


@st.composite
def valid_states(draw) -> HarnessState:
    n = draw(st.integers(2, 12))
    names = draw(st.lists(st.from_regex(r"[a-z][a-z_]{0,12}", fullmatch=True), min_size=n, max_size=n, unique=True))
    pool = {name: f"definition of {name}" for name in names}
    k = draw(st.integers(1, n))
    must = draw(st.lists(st.sampled_from(names), max_size=k, unique=True))
    lo = draw(st.sampled_from([0.0, 1 / k]) | st.floats(0.0, 1 / k))
    hi = draw(st.sampled_from([1.0, 1 / k]) | st.floats(1 / k, 1.0))
    state = HarnessState()
    state.dimension_pool = pool
    state.dimension_constraints.k = k
    state.dimension_constraints.must_include = must
    state.dimension_constraints.weight_min = lo
    state.dimension_constraints.weight_max = hi
    return state


@settings(max_examples=200, deadline=None)
@given(valid_states())
def test_fallback_rubric_is_valid_for_any_valid_state(state):
    try:
        state.validate()
    except HarnessStateError:
        return
    r = fallback_rubric(state)
    k = state.dimension_constraints.k
    assert len(r.dims) == k and r.dims[: len(state.dimension_constraints.must_include)] == tuple(
        state.dimension_constraints.must_include
    )
    p = parse_rubric(r.to_xml(), state)
    assert p.valid, p.error
    assert p.rubric == r
    assert fallback_rubric(state) == r  # deterministic


def _chars(ids) -> str:
    return "".join(chr(int(i)) for i in ids)


def test_rubric_token_span():
    assert rubric_token_span([5, 6, 7, 9, 7], _chars, chr(7)) == (0, 3)
    assert rubric_token_span([7], _chars, chr(7)) == (0, 1)
    assert rubric_token_span([5, 6], _chars, chr(7)) is None
    assert rubric_token_span([], _chars, chr(7)) is None
    assert rubric_token_span(torch.tensor([1, 2, 3, 2]), _chars, chr(2)) == (0, 2)
    # a close tag spread over several tokens ends at the token that completes it
    ids = [ord(c) for c in "ab</dim"] + [ord(c) for c in "ensions>zz"]
    assert rubric_token_span(ids, _chars) == (0, len("ab</dimensions>"))


def test_rubric_token_span_on_real_tokenizer_pieces(tokenizer):
    """With a tokenizer that splits the tag (here: the tag text forced through plain BPE pieces)."""
    text = '<think>ok</think><dimensions><dim name="a" weight="1.00"/></dimensions> trailing words'
    pieces = [tokenizer(c, add_special_tokens=False)["input_ids"] for c in text]  # one piece per char
    ids = [i for p in pieces for i in p]
    span = rubric_token_span(ids, tokenizer.decode)
    assert span is not None and tokenizer.decode(ids[: span[1]]).endswith("</dimensions>")
    assert not tokenizer.decode(ids[: span[1] - 1]).endswith("</dimensions>")


# ============================================================================ evaluation

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
