"""What the reward reads as a citation, and the one grounding rule every caller shares."""

from __future__ import annotations

import pytest

from score_lightning.rewards.citations import (cited_ids, citation_precision, citation_spans, cites_only_retrieved,
                                               mask_code, strip_citations, ungrounded_ids)
from score_lightning.roles.answer import parse_answer


def _answer(body: str) -> str:
    return f"<answer>{body}</answer>"


def test_an_indexing_expression_is_not_a_citation_of_its_index():
    """The review's case: a report cites [sys.argv], which it retrieved, and mentions sys.argv[1]."""
    text = _answer("The script name is sys.argv[0] and its first argument sys.argv[1], as documented [sys.argv].")
    parsed = parse_answer(text, retrieved=["sys.argv"], require_grounded=True)
    assert parsed.cited_ids == ("sys.argv",)
    assert parsed.valid, parsed.reason


@pytest.mark.parametrize("text", [
    'Look it up with d["k"] or cfg["model"].',
    "Nested indexing x[0][1] reads a row, then a column.",
    "A call result can be indexed: f(x)[0], items()[2] and {1: 2}[1].",
    "A quoted list '[1]' or \"[2]\" is a literal.",
    "See [the docs](https://docs.python.org) and ![a figure](fig.png).",
    "Inline code `sys.argv[1]` and ``argv[2]`` are code.",
    "```python\nimport sys\nprint(sys.argv[1])\n[3]\n```\n",
    "~~~\n[4]\n~~~",
    "[ref]: https://example.com/page",
])
def test_what_a_reader_does_not_take_for_a_reference(text):
    assert cited_ids(text) == ()


@pytest.mark.parametrize("text, ids", [
    ("Turing published it in 1936 [17].", ("17",)),  # Search-R1 / wiki-18 ids are numbers
    ("It serialises to JSON [json.dumps], and back [json.loads].", ("json.dumps", "json.loads")),
    ("Two sources agree [a][b], and a third [c].", ("a", "b", "c")),
    ("Wikipedia style.[5] Then more text (see [6]).", ("5", "6")),
    ("[doc_1] opens the line; so does a note: [doc_2]: it counts mid-line.", ("doc_1", "doc_2")),
    ("Code `x[1]` beside a citation [os.path] still counts the citation.", ("os.path",)),
    ("After a fence\n```\ny = z[0]\n```\nthe prose cites [pathlib].", ("pathlib",)),
])
def test_a_bracketed_id_standing_in_prose_is_a_citation(text, ids):
    assert cited_ids(text) == ids


def test_a_citation_repeated_is_counted_once_in_first_order():
    assert cited_ids("[b] then [a] and [b] again.") == ("b", "a")


def test_spans_point_at_the_brackets():
    text = "Alpha [a] beta sys.argv[1] gamma [b]."
    spans = citation_spans(text)
    assert [(text[s:e], i) for s, e, i in spans] == [("[a]", "a"), ("[b]", "b")]


def test_mask_code_keeps_length_and_lines():
    text = "a `b[1]` c\n```\nd[2]\n```\ne"
    masked = mask_code(text)
    assert len(masked) == len(text) and masked.count("\n") == text.count("\n")
    assert "[" not in masked and masked.startswith("a ") and masked.endswith("e")


def test_strip_citations_removes_only_citations():
    assert strip_citations("Read sys.argv[1] first [sys.argv]. Then d[\"k\"] [json].") == \
        'Read sys.argv[1] first. Then d["k"].'


def test_the_grounding_rule_by_hand():
    assert cites_only_retrieved(("a", "b"), ["a", "b", "c"])
    assert not cites_only_retrieved(("a", "z"), ["a", "b"])
    assert not cites_only_retrieved((), ["a"])  # no citation is not grounded
    assert ungrounded_ids(["z", "a", "z", "y"], ["a"]) == ("z", "y")
    assert citation_precision(["a", "z", "a"], ["a"]) == pytest.approx(0.5)
    assert citation_precision([], ["a"]) is None


def test_grounded_validity_reads_the_new_rule_both_ways():
    """A subscript no longer invalidates; a real unretrieved citation still does."""
    ok = parse_answer(_answer("Use x[0] and y[1] to read both values [array.array]."), retrieved=["array.array"],
                      require_grounded=True)
    bad = parse_answer(_answer("Use x[0] and read both values [array.array] [struct]."), retrieved=["array.array"],
                       require_grounded=True)
    assert ok.valid and ok.format_valid
    assert not bad.valid and bad.format_valid and bad.reason == "cites an id it never retrieved ([struct])"
    assert bad.ungrounded == ("struct",)


# ------------------------------------------------------------------ a citation with no space before it
@pytest.mark.parametrize("text, ids", [
    ("对象序列化为 JSON 字符串使用序列化对象[json.dumps]。", ("json.dumps",)),  # DeepResearch Bench: half Chinese
    ("在1932年[17]，图灵[18][19]发表了论文。", ("17", "18", "19")),  # after CJK any bracketed id cites
    ("发布于2020[3]。", ("3",)),  # a number inside CJK text is still a number
    ("It serialises per the standard[json.dumps].", ("json.dumps",)),
    ("Two functions agree[json.dumps][json.loads].", ("json.dumps", "json.loads")),
    ("Subclass it[argparse.Action-2].", ("argparse.Action-2",)),
    ("In 1932[17] he moved.", ("17",)),  # digits after a number: a footnote, not an index
    ("Served as a café[5].", ("5",)),  # after a non-ASCII letter
])
def test_a_citation_attached_to_the_word_before_it_is_read(text, ids):
    assert cited_ids(text) == ids


@pytest.mark.parametrize("text", [
    "The first argument is sys.argv[1], the last argv[-1].",
    "Nested x[0][1] and a2[3] and py3[1] index.",
    "A key d[k], D[key] or c[elem] looks a value up.",
    "Slices a[:i], a[i:], B[start:end], B[start,end] and heap[2*k+1].",
    "An attribute as key: sys.modules[obj.__module__].",
    "Ellipsis x[...] indexes everything.",
])
def test_indexing_after_an_ascii_identifier_stays_code(text):
    assert cited_ids(text) == ()


def test_known_ids_make_an_attached_bracket_a_citation():
    """The trajectory's retrieved ids resolve `it[17]` (a footnote on a numeric corpus) and `x[pathlib]`."""
    text = "Turing showed it[17], see also the standard[pathlib] and sys.argv[1]."
    assert cited_ids(text) == ()
    assert cited_ids(text, known_ids={"17", "pathlib"}) == ("17", "pathlib")
    # known ids only add citations: an unknown dotted id attached to a word still cites (and is ungrounded)
    assert cited_ids("As the standard[json.dumps] says.", known_ids={"pathlib"}) == ("json.dumps",)
    # a chain is decided by its first group: x[0][1] stays an index even when 1 is a known id
    assert cited_ids("Read x[0][1].", known_ids={"1"}) == ()
    # after a closing bracket, a call or a quote nothing changes
    assert cited_ids('f(x)[17] and d["k"]', known_ids={"17"}) == ()


def test_strip_citations_and_spans_share_the_rule():
    text = "Serialise it[json.dumps], read sys.argv[1]，再看对象[17]。"
    assert [text[s:e] for s, e, _ in citation_spans(text)] == ["[json.dumps]", "[17]"]
    assert strip_citations("Serialise per the standard[json.dumps]. Read argv[1] too[17].", known_ids={"17"}) == \
        "Serialise per the standard. Read argv[1] too."


def test_grounded_validity_reads_an_attached_citation_with_the_retrieved_ids():
    """The reward passes the trajectory's retrieved ids: a Chinese report citing what it retrieved is valid,
    and an attached citation of an id it never retrieved is read and invalidates."""
    ok = parse_answer(_answer("使用 json 模块序列化对象[json.dumps]，反序列化用[json.loads]。"),
                      retrieved=["json.dumps", "json.loads"], require_grounded=True)
    assert ok.valid and ok.cited_ids == ("json.dumps", "json.loads"), ok.reason
    numeric = parse_answer(_answer("Turing published the paper in 1936, it[17] says so."), retrieved=["17"],
                           require_grounded=True)
    assert numeric.valid and numeric.cited_ids == ("17",)
    bad = parse_answer(_answer("It serialises per the standard[json.dumps] and more."), retrieved=["json.loads"],
                       require_grounded=True)
    assert not bad.valid and bad.ungrounded == ("json.dumps",)


def test_the_card_and_the_judge_read_attached_citations_with_the_retrieved_ids():
    """Both pass the sample's retrieved ids: `it[17]` is a citation of a retrieved 17, so precision counts it."""
    from score_lightning.evaluation.card import query_scores
    from score_lightning.evaluation.judge import cited_statements

    scores = query_scores("Turing published it[17]. 图灵发表了论文[18]。", {"retrieved_ids": ["17"]}, ["17", "18"])
    assert scores["citation_precision"] == pytest.approx(0.5) and scores["coverage"] == pytest.approx(1.0)
    assert cited_statements("Turing published it[17].", {"17"}) == [("Turing published it[17].", "17")]
    assert cited_statements("Turing published it[17].") == []
