"""The evaluator's rubric: its parser on valid and invalid examples with their reasons, the fallback rubric, and the
rubric's token span. Scoring, answers and prompts: ``test_role_outputs.py``."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from score_lightning.harness.state import HarnessState, HarnessStateError
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
