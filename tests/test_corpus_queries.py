"""Corpus and query files: the stdlib corpus builder, JSONL validation with file:line errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from score_lightning.data.corpus import (
    DOC_ID_RE,
    DataFormatError,
    Document,
    build_stdlib_corpus,
    default_corpus_path,
    load_corpus,
    parse_contents,
)
from score_lightning.data.queries import EMBEDDED_QUERIES_PATH, Query, load_queries


@pytest.fixture(scope="session")
def stdlib_corpus(tmp_path_factory) -> Path:
    return default_corpus_path(tmp_path_factory.mktemp("stdlib_cache"))


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------ contents


def test_contents_round_trip_and_tolerant_parsing():
    doc = Document(id="json.dumps", title="json.dumps", text='Serialize ``obj``.\n\nSecond "para".')
    assert doc.contents == '"json.dumps"\nSerialize ``obj``.\n\nSecond "para".'
    assert parse_contents(doc.contents) == (doc.title, doc.text)
    assert parse_contents("Title without quotes\nbody") == ("Title without quotes", "body")
    assert parse_contents("just a passage, no title") == ("", "just a passage, no title")
    assert parse_contents('""\nbody') == ("", "body")


# ------------------------------------------------------------------------------ stdlib corpus


def test_stdlib_corpus_shape(stdlib_corpus):
    docs = load_corpus(stdlib_corpus)
    assert 1000 <= len(docs) <= 6000, len(docs)
    ids = [d.id for d in docs]
    assert len(set(ids)) == len(ids)
    assert all(DOC_ID_RE.fullmatch(i) for i in ids)
    for d in docs:
        base = d.id.split("-")[0]
        assert d.title == base  # title is the dotted name, chunk suffix stripped
        assert 1 <= len(d.text.split()) <= 120
    by_id = {d.id: d for d in docs}
    # Real API entries under the names users search for, not re-export or private-module names.
    for name in ("json.dumps", "collections.OrderedDict", "collections.OrderedDict.move_to_end",
                 "concurrent.futures.ThreadPoolExecutor", "os.path.join", "threading.Lock", "array.array"):
        assert name in by_id, name
    assert "JSON" in by_id["json.dumps"].text
    assert not any(i.startswith(("posix.", "posixpath.", "multiprocessing.dummy.Lock")) for i in ids)
    # Long docstrings are split at paragraph boundaries into numbered chunks.
    assert "json-2" in by_id and by_id["json-2"].title == "json"


def test_stdlib_corpus_is_deterministic_and_isolated(stdlib_corpus, tmp_path):
    again = build_stdlib_corpus(tmp_path / "again.jsonl")
    assert again.read_bytes() == stdlib_corpus.read_bytes()
    # Modules with import side effects were only ever imported in the child process.
    for mod in ("antigravity", "this", "tkinter", "turtle", "idlelib"):
        assert mod not in sys.modules, mod
    assert not list(tmp_path.glob(".*tmp")), "temporary file left behind"


def test_stdlib_corpus_respects_max_words(tmp_path):
    path = build_stdlib_corpus(tmp_path / "small.jsonl", max_words=30)
    docs = load_corpus(path)
    assert all(len(d.text.split()) <= 30 for d in docs)
    ids = {d.id for d in docs}
    # Every continuation chunk follows its head chunk.
    for i in ids:
        if "-" in i:
            base, n = i.rsplit("-", 1)
            assert base in ids and (int(n) == 2 or f"{base}-{int(n) - 1}" in ids), i
    with pytest.raises(ValueError, match="max_words"):
        build_stdlib_corpus(tmp_path / "x.jsonl", max_words=3)


def test_default_corpus_path_uses_env_cache_and_does_not_rebuild(tmp_path, monkeypatch):
    monkeypatch.setenv("SCORE_LIGHTNING_CACHE", str(tmp_path))
    expected = default_corpus_path(tmp_path)  # builds it
    assert expected.parent == tmp_path
    expected.write_text('{"id": "marker", "contents": "\\"m\\"\\nkept"}\n')
    assert default_corpus_path() == expected  # env var chooses the same cache dir
    assert load_corpus(expected)[0].id == "marker"  # an existing corpus is not rebuilt


# ------------------------------------------------------------------------- corpus validation


def test_corpus_accepts_extra_fields_and_int_ids(tmp_path):
    path = _write(tmp_path / "c.jsonl", [
        '{"id": "a.b", "contents": "\\"A\\"\\ntext a", "source": "wiki"}',
        "",
        '{"id": 7, "contents": "bare text"}',
    ])
    docs = load_corpus(path)
    assert [(d.id, d.title, d.text) for d in docs] == [("a.b", "A", "text a"), ("7", "", "bare text")]


@pytest.mark.parametrize("bad_line, lineno, fragment", [
    ('{"id": "c", "contents": "x"', 3, "invalid JSON"),
    ('{"id": "c"}', 3, 'missing field "contents"'),
    ('{"contents": "x"}', 3, 'missing field "id"'),
    ('{"id": "a", "contents": "dup"}', 3, "duplicate id 'a' (first seen on line 1)"),
    ('{"id": "has space", "contents": "x"}', 3, "invalid id"),
    ('{"id": "cite[1]", "contents": "x"}', 3, "square brackets"),
    ('{"id": "", "contents": "x"}', 3, "invalid id"),
    ('{"id": "c", "contents": ""}', 3, "non-empty string"),
    ('["id", "contents"]', 3, "expected a JSON object"),
])
def test_corpus_errors_name_file_and_line(tmp_path, bad_line, lineno, fragment):
    path = _write(tmp_path / "corpus.jsonl", [
        '{"id": "a", "contents": "\\"A\\"\\ntext"}',
        '{"id": "b", "contents": "\\"B\\"\\ntext"}',
        bad_line,
        '{"id": "d", "contents": "\\"D\\"\\ntext"}',
    ])
    with pytest.raises(DataFormatError) as info:
        load_corpus(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}:{lineno}: "), msg
    assert fragment in msg
    assert info.value.lineno == lineno


def test_corpus_line_numbers_count_blank_lines(tmp_path):
    path = _write(tmp_path / "c.jsonl", ['{"id": "a", "contents": "x"}', "", "", "{oops"])
    with pytest.raises(DataFormatError, match=rf"^{path}:4: invalid JSON"):
        load_corpus(path)


def test_missing_corpus_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_corpus(tmp_path / "nope.jsonl")


# -------------------------------------------------------------------------------------- queries


def test_embedded_queries():
    queries = load_queries()
    assert load_queries(EMBEDDED_QUERIES_PATH) == queries
    assert len(queries) >= 48
    ids = [q.id for q in queries]
    assert len(set(ids)) == len(ids)
    prompts = [q.prompt for q in queries]
    assert len(set(prompts)) == len(prompts)
    for q in queries:
        # Deep-research style: a multi-part question, not a keyword.
        assert len(q.prompt.split()) >= 15, q.id
        assert q.prompt.count(",") + q.prompt.count("?") >= 2, q.id


def test_deepresearch_bench_line_loads_as_is(tmp_path):
    line = {"id": 51, "topic": "Finance", "language": "en", "prompt": "Analyse the outlook for X."}
    path = _write(tmp_path / "query.jsonl", [json.dumps(line), json.dumps({"id": "q2", "prompt": "Why?"})])
    q1, q2 = load_queries(path)
    assert q1 == Query(id="51", prompt="Analyse the outlook for X.",
                       extra={"topic": "Finance", "language": "en", "id": 51})
    assert q2 == Query(id="q2", prompt="Why?", extra={})


@pytest.mark.parametrize("bad_line, fragment", [
    ('{"id": "q3", "prompt": ', "invalid JSON"),
    ('{"id": "q3"}', 'missing field "prompt"'),
    ('{"id": "q3", "prompt": "   "}', '"prompt" must be a non-empty string'),
    ('{"prompt": "why?"}', 'missing field "id"'),
    ('{"id": null, "prompt": "why?"}', '"id" must be'),
    ('{"id": "q1", "prompt": "again"}', "duplicate id 'q1' (first seen on line 1)"),
    ('{"id": 1, "prompt": "int id colliding with a str id"}', "duplicate id '1'"),
])
def test_query_errors_name_file_and_line(tmp_path, bad_line, fragment):
    path = _write(tmp_path / "queries.jsonl", [
        '{"id": "q1", "prompt": "first?"}',
        '{"id": "1", "prompt": "second?"}',
        "",
        bad_line,
    ])
    with pytest.raises(DataFormatError) as info:
        load_queries(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}:4: "), msg
    assert fragment in msg
