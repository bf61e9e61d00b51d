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
