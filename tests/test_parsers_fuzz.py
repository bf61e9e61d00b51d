"""Property tests: every parser survives arbitrary text and never calls a truncated output valid.

Examples: 400 + 400 + 150 + 150 + 100 + 100 = 1300 in total.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from score_lightning.harness.state import HarnessState
from score_lightning.protocol import PROTOCOL_TOKENS
from score_lightning.rewards.citations import cited_ids
from score_lightning.roles.answer import AnswerParse, extract_conclusion, parse_answer
from score_lightning.roles.evaluation import EvaluationParse, ReportScores, parse_evaluation
from score_lightning.roles.rubric import Rubric, RubricParse, fallback_rubric, parse_rubric, rubric_token_span

STATE = HarnessState()
POOL = list(STATE.dimension_pool)
RUB = fallback_rubric(STATE)
FAST = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

FRAGMENTS = list(PROTOCOL_TOKENS) + [
    '<dim name="factual_support" weight="0.4"/>', "<dim ", 'name="insight"', "weight='0.3'", "/>", ">", "<", '"',
    '<report id="1">', "<report id='2'>", '<score dim="factual_support" value="7" reason="x"/>',
    '<score dim="insight" value="11"/>', "value=", "[json.dumps]", "[", "]", "Conclusion:", "In conclusion,",
    "Overall,", "\n\n", ". ", "nan", "1e309", "-0", "&quot;", "\x00", "é",
]
fragment_text = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=8), max_size=40).map("".join)


def _chars(ids) -> str:
    return "".join(chr(int(i)) for i in ids)


def check_all_parsers(text: str) -> None:
    """Each parser returns its typed result on ``text``; invalid results carry a reason."""
    rp = parse_rubric(text, STATE)
    assert isinstance(rp, RubricParse) and rp.valid == (rp.error == "")
    assert rp.rubric is None or isinstance(rp.rubric, Rubric)
    for k in (1, 3):
        ep = parse_evaluation(text, RUB, k, require_verification=True, require_gap_analysis=k == 3)
        assert isinstance(ep, EvaluationParse) and ep.valid == (ep.error == "")
        assert all(isinstance(r, ReportScores) and 1 <= rid <= k for rid, r in ep.reports.items())
        matrix = ep.score_matrix(RUB, k)
        assert len(matrix) == k and all(len(row) == len(RUB.dims) and all(0 <= v <= 1 for v in row) for row in matrix)
    ap = parse_answer(text, require_citation=True)
    assert isinstance(ap, AnswerParse) and ap.valid == (ap.reason == "")
    assert len(set(ap.cited_ids)) == len(ap.cited_ids)
    conclusion = extract_conclusion(text)
    assert isinstance(conclusion, str) and not cited_ids(conclusion)
    if ap.answer is not None:
        assert isinstance(extract_conclusion(ap.answer), str)
    assert rubric_token_span([ord(c) for c in text], _chars, ">") == (
        (0, text.index(">") + 1) if ">" in text else None
    )


@settings(max_examples=400, **FAST)
@given(st.text(max_size=300))
def test_random_text(text):
    check_all_parsers(text)


@settings(max_examples=400, **FAST)
@given(fragment_text)
def test_protocol_fragment_mixes(text):
    check_all_parsers(text)


# ----------------------------------------------------------------------------- truncations of valid outputs


@st.composite
def valid_rubric_xml(draw) -> str:
    others = draw(st.permutations(POOL[1:]))[:3]
    dims = ["factual_support"] + list(others)
    order = draw(st.permutations(range(4)))
    weights = draw(st.sampled_from([(0.4, 0.2, 0.2, 0.2), (0.25,) * 4, (0.1, 0.3, 0.3, 0.3), (0.5, 0.5 / 3, 0.5 / 3, 0.5 / 3)]))
    rubric = Rubric(tuple(dims[i] for i in order), tuple(weights[i] for i in order))
    prefix = draw(st.sampled_from(["", "<think>choose well</think>\n", "Here is the rubric: "]))
    return prefix + rubric.to_xml()


@settings(max_examples=150, **FAST)
@given(valid_rubric_xml(), st.data())
def test_truncated_rubric_is_invalid(text, data):
    full = parse_rubric(text, STATE)
    assert full.valid, full.error
    cut = data.draw(st.integers(0, len(text) - 1))
    part = parse_rubric(text[:cut], STATE)
    assert isinstance(part, RubricParse) and not part.valid and part.error
    check_all_parsers(text[:cut])


@st.composite
def valid_evaluation_xml(draw) -> tuple[str, int]:
    k = draw(st.integers(1, 4))
    reports = []
    for rid in draw(st.permutations(range(1, k + 1))):
        scores = "".join(
            f'<score dim="{d}" value="{draw(st.integers(0, 10))}" reason="ok"/>' for d in draw(st.permutations(RUB.dims))
        )
        reports.append(
            f'<report id="{rid}"><verification>checked [a]</verification><gap_analysis>gap</gap_analysis>'
            f"<scores>{scores}</scores></report>"
        )
    prefix = draw(st.sampled_from(["", "<think>verify</think><search>q</search><observation>doc</observation>"]))
    return prefix + "<report_evaluations>" + "".join(reports) + "</report_evaluations>", k


@settings(max_examples=150, **FAST)
@given(valid_evaluation_xml(), st.data())
def test_truncated_evaluation_is_invalid(sample, data):
    text, k = sample
    kwargs = dict(require_verification=True, require_gap_analysis=True)
    full = parse_evaluation(text, RUB, k, **kwargs)
    assert full.valid, full.error
    cut = data.draw(st.integers(0, len(text) - 1))
    part = parse_evaluation(text[:cut], RUB, k, **kwargs)
    assert isinstance(part, EvaluationParse) and not part.valid and part.error
    # truncation never invents scores: whatever survives equals the full parse
    for rid, rep in part.reports.items():
        for dim, value in rep.scores.items():
            assert value == full.reports[rid].scores[dim]
    check_all_parsers(text[:cut])


@st.composite
def valid_answer_text(draw) -> str:
    body = draw(st.text(alphabet="abcdefgh ,.\n", min_size=25, max_size=120).filter(lambda s: len(s.replace(" ", "")) >= 25))
    cite = draw(st.sampled_from(["[json.dumps]", "[doc_1]", "[os.path.join]"]))
    prefix = draw(st.sampled_from(["", "<think>t</think>", "<search>q</search><observation>o</observation>"]))
    return f"{prefix}<answer>{body} {cite}. Conclusion: done.</answer>"


@settings(max_examples=100, **FAST)
@given(valid_answer_text(), st.data())
def test_truncated_answer_is_invalid(text, data):
    assert parse_answer(text, require_citation=True).valid
    assert not parse_answer(text, truncated=True).valid
    cut = data.draw(st.integers(0, len(text) - 1))
    part = parse_answer(text[:cut], require_citation=True)
    assert isinstance(part, AnswerParse) and not part.valid and part.reason
    check_all_parsers(text[:cut])


@settings(max_examples=100, **FAST)
@given(st.lists(st.integers(0, 20), max_size=50), st.integers(0, 20))
def test_rubric_token_span_property(ids, close):
    span = rubric_token_span(ids, _chars, chr(close))
    if close not in ids:
        assert span is None
    else:
        assert span == (0, ids.index(close) + 1)
