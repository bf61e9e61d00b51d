"""Every reader of citations in ``src/`` reads them by the one rule of ``rewards/citations.py`` (issue 69).

A second reading (the report edits' own bracket regex, the pair builder's call without the report's retrieved
ids) made the edits differ from their originals in more than the one flaw, or skip reports the reward reads as
cited. Here the edits, the pair builder, the judge, the card, the claims and the passages agree with the reward's
parse on hand-worked tricky strings, and a scan of the source refuses a second citation regex.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from score_lightning.rewards.citations import cited_ids, strip_citations
from score_lightning.roles.answer import parse_answer

SRC = Path(__file__).resolve().parents[1] / "src" / "score_lightning"
CJK_REMARK = "数据(见下)[doc-1]。"

#: (text, retrieved ids, cited ids by hand, the text with its citations dropped, the first cited id -> os.path)
TRICKY = [
    ("数据(见下)[doc-1]。另见 sys.argv[1]。", ("doc-1",), ("doc-1",),
     "数据(见下)。另见 sys.argv[1]。", "数据(见下)[os.path]。另见 sys.argv[1]。"),
    ("Turing published it[17] and f(x)[17] is code.", ("17",), ("17",),
     "Turing published it and f(x)[17] is code.", "Turing published it[os.path] and f(x)[17] is code."),
    ("Run `sys.argv[1]` as documented [sys.argv]; a[1] indexes.", ("sys.argv",), ("sys.argv",),
     "Run `sys.argv[1]` as documented; a[1] indexes.", "Run `sys.argv[1]` as documented [os.path]; a[1] indexes."),
    ("See [the docs](https://x.y) and [json.dumps][json.loads].", ("json.dumps", "json.loads"),
     ("json.dumps", "json.loads"), "See [the docs](https://x.y) and.",
     "See [the docs](https://x.y) and [os.path][json.loads]."),
]


@pytest.mark.parametrize("text, ids", [
    (CJK_REMARK, ("doc-1",)),
    ("data (见下)[doc-1].", ("doc-1",)),  # a CJK remark after a space
    ("数据(JSON)[doc-1]。", ("doc-1",)),  # an ASCII remark right after a CJK word
    ("As shown (see below)[json.dumps].", ("json.dumps",)),  # an ASCII remark: a dotted id cites
    ("Nested ((见下))[d].", ("d",)),
])
def test_a_citation_after_a_parenthetical_remark_is_read(text, ids):
    assert cited_ids(text) == ids


@pytest.mark.parametrize("text", [
    "A call f(x)[0], items()[2] and g()(x)[0] are indexed.",
    "A tuple (a, b)[1] and (see below)[doc-1] without known ids read as code.",
    "Unbalanced a) b)[1] stays code.",
    "Across lines (见下\n)[1] the remark is not matched.",
])
def test_brackets_after_a_call_or_an_ascii_expression_stay_code(text):
    assert cited_ids(text) == ()


def test_an_ascii_remark_cites_a_known_id_but_a_call_never_does():
    assert cited_ids("As shown (see below)[17].", known_ids={"17"}) == ("17",)
    assert cited_ids("f(x)[17]", known_ids={"17"}) == ()


def test_every_reader_reads_the_cjk_remark_as_citing_doc_1():
    from score_lightning.evaluation.card import query_scores
    from score_lightning.evaluation.judge import cited_statements
    from score_lightning.methods.judge.citation_claims import report_claims
    from score_lightning.rewards.report_edits import bracketed_ids, drop_citations, replace_citation
    from score_lightning.roles.cited_passages import cited_passages
    from score_lightning.methods.mams.demos import memory_facts

    assert cited_ids(CJK_REMARK) == ("doc-1",) and strip_citations(CJK_REMARK) == "数据(见下)。"
    parsed = parse_answer(f"<answer>{CJK_REMARK}</answer>", retrieved=["doc-1"], require_grounded=True, min_chars=1)
    assert parsed.valid and parsed.cited_ids == ("doc-1",), parsed.reason
    assert cited_statements(CJK_REMARK) == [(CJK_REMARK, "doc-1")]
    assert query_scores(CJK_REMARK, {"retrieved_ids": ["doc-1"]}, ["doc-1"])["citations"] == 1.0
    assert [(c.text, c.cited) for c in report_claims(CJK_REMARK)] == [("数据(见下)。", ("doc-1",))]
    assert cited_passages(CJK_REMARK, ["doc-1"], {"doc-1": "p"}, 3) == [("doc-1", "p", True)]
    assert bracketed_ids(CJK_REMARK) == ["doc-1"]
    assert drop_citations(CJK_REMARK) == "数据(见下)。"
    assert replace_citation(CJK_REMARK, "doc-1", "os.path") == "数据(见下)[os.path]。"
    assert [(f.doc_id, f.sentence) for f in memory_facts("数据(见下)[doc-1]. Then sys.argv[1] [a.b].")] == \
        [("doc-1", "数据(见下)."), ("a.b", "Then sys.argv[1].")]


@pytest.mark.parametrize("text, retrieved, ids, dropped, replaced", TRICKY)
def test_report_edits_agree_with_the_reward_on_tricky_strings(text, retrieved, ids, dropped, replaced):
    from score_lightning.rewards.report_edits import bracketed_ids, drop_citations, replace_citation

    assert parse_answer(f"<answer>{text}</answer>", retrieved=list(retrieved)).cited_ids == ids
    assert bracketed_ids(text, retrieved) == list(ids)
    assert drop_citations(text, retrieved) == dropped
    assert cited_ids(dropped, retrieved) == ()
    assert replace_citation(text, ids[0], "os.path", retrieved) == replaced


@pytest.mark.parametrize("text, retrieved, ids, dropped, replaced", TRICKY)
def test_pair_build_edits_read_citations_with_the_reports_retrieved_ids(text, retrieved, ids, dropped, replaced):
    from score_lightning.evaluation.pair_build import Sample, build_pairs

    sample = Sample("q1", "A question?", text, retrieved, True)
    pairs, stats = build_pairs([sample], {}, random.Random(0), max_degraded=10, max_valid=0,
                               known_ids=(*retrieved, "os.path"), min_chars=1,
                               kinds=("no_citation", "unretrieved_citation"))
    edits = {p.kind: p.sides[p.worse] for p in pairs}
    assert stats.skipped == {"no_citation": 0, "unretrieved_citation": 0}
    assert edits["no_citation"].text == dropped and not edits["no_citation"].grounded_valid
    assert edits["unretrieved_citation"].text == replaced and not edits["unretrieved_citation"].grounded_valid


#: a regex literal that reads a bracketed id anywhere (``\[([^\]\s]+)\]``, ``\[[^\]]+\]``): a second citation rule
_BRACKET_ID = re.compile(r"\\\[\(?\[\^\\\]")
#: what may stand before one: a line-start anchor, as in an observation's ``[id] `` passage heads
_ANCHORED = re.compile(r"(?:\^|\(\?:\^\|[^()]*\))$")


def _second_rules(source: str) -> list[str]:
    """String literals of ``source`` holding an unanchored bracketed-id pattern."""
    import ast

    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out += [node.value for m in _BRACKET_ID.finditer(node.value) if not _ANCHORED.search(node.value[:m.start()])]
    return out


def test_the_scan_finds_a_second_citation_regex_and_passes_passage_heads():
    assert _second_rules('CITE_RE = re.compile(r"\\[([^\\]\\s]+)\\]")')
    assert _second_rules('n = len(re.findall(r"\\[[^\\]\\s]+\\]", text))')
    assert not _second_rules('HEAD = re.compile(r"^\\[([^\\]\\s]+)\\] ", re.MULTILINE)')
    assert not _second_rules('OBS = re.compile(r"(?:^|<observation>)\\[([^\\]\\s]+)\\] ")')


def test_no_module_but_citations_py_has_its_own_citation_regex():
    found = {str(p.relative_to(SRC)): hits for p in sorted(SRC.rglob("*.py"))
             if p.name != "citations.py" and (hits := _second_rules(p.read_text(encoding="utf-8")))}
    assert found == {}
