"""BM25 over the stdlib corpus, index caching, the HTTP server/client pair and its retry policy."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import fastapi
import pytest
import requests
from fastapi.responses import JSONResponse, PlainTextResponse

from score_lightning.data.corpus import default_corpus_path
from score_lightning.data.queries import load_queries
from score_lightning.retrieval.base import RetrievalError, Retriever, SearchHit
from score_lightning.retrieval.bm25 import META_FILE, BM25Retriever
from score_lightning.retrieval.factory import build_retriever
from score_lightning.retrieval.http import HTTPRetriever
from score_lightning.launch.retrieval_server import make_app, serve_in_thread

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def corpus_path(tmp_path_factory) -> Path:
    return default_corpus_path(tmp_path_factory.mktemp("stdlib_cache"))


@pytest.fixture(scope="session")
def bm25(corpus_path, tmp_path_factory) -> BM25Retriever:
    return BM25Retriever(corpus_path, index_dir=tmp_path_factory.mktemp("index") / "bm25")


@pytest.fixture(scope="session")
def server_url(bm25):
    server, base = serve_in_thread(make_app(bm25))
    yield base
    server.should_exit = True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _hits(results: list[list[SearchHit]]) -> list[list[tuple[str, float]]]:
    return [[(h.id, h.score) for h in hits] for hits in results]


# ------------------------------------------------------------------------------------------ BM25


@pytest.mark.parametrize("query, expected", [
    ("serialize object to JSON formatted str", "json.dumps"),
    ("ordered dict move key to end", "collections.OrderedDict.move_to_end"),
    ("LRU cache decorator", "functools.lru_cache"),
    ("constant time comparison of digests to prevent timing attacks", "hmac.compare_digest"),
    ("generate a random URL-safe text token", "secrets.token_urlsafe"),
    ("split a string using shell-like syntax", "shlex.split"),
    ("safely evaluate a string containing a Python literal", "ast.literal_eval"),
    ("rotate log file when it reaches a certain size", "logging.handlers.RotatingFileHandler"),
])
def test_bm25_ranks_the_right_doc_first(bm25, query, expected):
    [hits] = bm25.search([query], topk=5)
    assert hits[0].id.split("-")[0] == expected, [h.id for h in hits]


def test_bm25_hits_are_ranked_real_scores(bm25):
    results = bm25.search(["thread pool executor", "heap queue priority", "deep copy"], topk=7)
    assert len(results) == 3
    for hits in results:
        assert len(hits) == 7
        scores = [h.score for h in hits]
        assert scores == sorted(scores, reverse=True)
        assert all(isinstance(s, float) and s > 0 for s in scores)
        assert len({h.id for h in hits}) == 7
        h = hits[0]
        assert h.contents == f'"{h.title}"\n{h.text}' and h.title == h.id.split("-")[0]
    # A longer list is a prefix-extension of a shorter one (same scoring, deterministic ties).
    assert _hits(bm25.search(["heap queue priority"], 3))[0] == _hits(results)[1][:3]


def test_bm25_name_queries_find_identifiers(bm25):
    for q in ("OrderedDict", "ordered dict", "collections.OrderedDict"):
        [hits] = bm25.search([q], topk=3)
        assert "collections.OrderedDict" in [h.id for h in hits], (q, [h.id for h in hits])
    [hits] = bm25.search(["move_to_end"], topk=1)
    assert hits[0].id == "collections.OrderedDict.move_to_end"


def test_bm25_empty_and_degenerate_queries(bm25):
    assert bm25.search([], topk=3) == []
    assert bm25.search(["", "the and of", "zzqqxxnotaword"], topk=3) == [[], [], []]
    with pytest.raises(ValueError, match="topk"):
        bm25.search(["json"], topk=0)
    with pytest.raises(TypeError, match="list of strings"):
        bm25.search("json", topk=3)  # type: ignore[arg-type]
    assert isinstance(bm25, Retriever)


def test_embedded_queries_all_retrieve(bm25):
    queries = load_queries()
    results = bm25.search([q.prompt for q in queries], topk=5)
    for q, hits in zip(queries, results):
        assert len(hits) == 5, q.id
        # Answerable from several passages of the topic the question is about.
        assert len({h.id.split("-")[0] for h in hits}) >= 2, q.id


def test_index_round_trip_and_rebuild_on_corpus_change(corpus_path, tmp_path):
    queries = ["serialize JSON", "thread lock reentrant", "temporary directory cleanup"]
    corpus = tmp_path / "corpus.jsonl"
    shutil.copy(corpus_path, corpus)
    index = tmp_path / "index"
    built = BM25Retriever(corpus, index_dir=index)
    assert not built.loaded_from_disk
    assert (index / META_FILE).is_file()
    loaded = BM25Retriever(corpus, index_dir=index)
    assert loaded.loaded_from_disk
    assert _hits(loaded.search(queries, 10)) == _hits(built.search(queries, 10))

    # Different BM25 parameters must not reuse the saved index.
    assert not BM25Retriever(corpus, index_dir=index, k1=1.2).loaded_from_disk
    assert BM25Retriever(corpus, index_dir=index, k1=1.2).loaded_from_disk

    # Same number of documents, one passage edited: only the content hash can tell.
    lines = corpus.read_text().splitlines(keepends=True)
    first = json.loads(lines[0])
    lines[0] = json.dumps({"id": first["id"], "contents": f'"{first["id"]}"\nQuagga zebra stripes.'}) + "\n"
    corpus.write_text("".join(lines))
    changed = BM25Retriever(corpus, index_dir=index, k1=1.2)  # same parameters as the saved index
    assert not changed.loaded_from_disk
    assert changed.search(["quagga stripes"], 1)[0][0].id == first["id"]
    assert BM25Retriever(corpus, index_dir=index, k1=1.2).loaded_from_disk


def test_concurrent_constructors_build_once(corpus_path, tmp_path):
    index = tmp_path / "shared"
    made: list[BM25Retriever] = []
    threads = [threading.Thread(target=lambda: made.append(BM25Retriever(corpus_path, index_dir=index)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.loaded_from_disk for r in made) == [False, True, True]
    assert len({json.dumps(_hits(r.search(["json dumps", "lock"], 5))) for r in made}) == 1


def test_damaged_index_is_rebuilt(corpus_path, tmp_path):
    index = tmp_path / "index"
    BM25Retriever(corpus_path, index_dir=index)
    for f in index.glob("*.npy"):
        f.write_bytes(b"garbage")
    again = BM25Retriever(corpus_path, index_dir=index)
    assert not again.loaded_from_disk
    assert again.search(["LRU cache decorator"], 1)[0][0].id == "functools.lru_cache"


# ------------------------------------------------------------------------------- server + client


def test_server_round_trip_matches_direct_bm25(bm25, server_url):
    queries = ["serialize object to JSON formatted str", "asyncio gather wait", "", "heap queue"]
    client = HTTPRetriever(server_url + "/retrieve")
    remote = client.search(queries, topk=5)
    assert remote == bm25.search(queries, topk=5)  # same ids, contents and exact float scores
    assert remote[2] == [] and len(remote[0]) == 5
    assert client.num_requests == 1 and client.num_failures == 0
    assert requests.get(server_url + "/health", timeout=5).json() == {"status": "ok", "num_docs": len(bm25)}


def test_server_plain_format_and_validation(bm25, server_url):
    url = server_url + "/retrieve"
    body = requests.post(url, json={"queries": ["json dumps"], "topk": 2, "return_scores": False}, timeout=5).json()
    assert [e["id"] for e in body["result"][0]] == [h.id for h in bm25.search(["json dumps"], 2)[0]]
    assert set(body["result"][0][0]) == {"id", "contents"}
    for bad in ({"queries": ["x"], "topk": 0}, {"queries": ["x"], "topk": 101}, {"queries": "x", "topk": 3},
                {"queries": [1, {"a": 2}], "topk": 3}, {"topk": 3}):
        assert requests.post(url, json=bad, timeout=5).status_code == 422, bad


def test_client_error_is_not_retried(server_url):
    client = HTTPRetriever(server_url + "/retrieve", max_retries=3, backoff_s=0.01)
    slept: list[float] = []
    client._sleep = slept.append
    with pytest.raises(RetrievalError, match=r"HTTP 422.*not retried"):
        client.search(["x"], topk=0)
    assert client.num_requests == 1 and client.num_failures == 1 and slept == []


def test_server_down_retries_then_raises():
    with socket.socket() as s:  # a port that was free a moment ago and is now closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/retrieve"
    client = HTTPRetriever(url, timeout_s=2, max_retries=3, backoff_s=0.01, backoff_factor=3.0)
    slept: list[float] = []
    client._sleep = slept.append
    with pytest.raises(RetrievalError) as info:
        client.search(["json"], topk=3)
    assert url in str(info.value) and "4 attempts" in str(info.value)
    assert "ConnectionError" in str(info.value)
    assert client.num_requests == 4 and client.num_failures == 1
    assert slept == pytest.approx([0.01, 0.03, 0.09])


def test_real_backoff_sleeps():
    port = _free_port()
    client = HTTPRetriever(f"http://127.0.0.1:{port}/retrieve", max_retries=2, backoff_s=0.05)
    t0 = time.monotonic()
    with pytest.raises(RetrievalError):
        client.search(["json"], topk=3)
    assert time.monotonic() - t0 >= 0.05 + 0.1 - 0.01
    assert client.num_requests == 3


def _scripted_app(responses: list) -> tuple[fastapi.FastAPI, list[dict]]:
    """An app that answers successive requests from ``responses`` and records the bodies."""
    seen: list[dict] = []
    lock = threading.Lock()
    app = fastapi.FastAPI()

    @app.post("/retrieve")
    async def retrieve(request: fastapi.Request):
        with lock:
            seen.append(await request.json())
            status, body = responses[min(len(seen), len(responses)) - 1]
        if isinstance(body, str):
            return PlainTextResponse(body, status_code=status)
        return JSONResponse(body, status_code=status)

    return app, seen


def test_flaky_server_recovers():
    ok = {"result": [[{"document": {"id": "a.b", "contents": '"a.b"\ntext'}, "score": 2.5}],
                     [{"id": "c", "contents": "plain"}]]}
    app, seen = _scripted_app([(500, {"detail": "boom"}), (503, "unavailable"), (200, "{not json"), (200, ok)])
    server, base = serve_in_thread(app)
    try:
        client = HTTPRetriever(base + "/retrieve", max_retries=3, backoff_s=0.01)
        slept: list[float] = []
        client._sleep = slept.append
        hits = client.search(["q1", "q2"], topk=4)
    finally:
        server.should_exit = True
    assert hits == [[SearchHit("a.b", '"a.b"\ntext', 2.5)], [SearchHit("c", "plain", 0.0)]]
    assert hits[0][0].title == "a.b" and hits[0][0].text == "text"
    assert client.num_requests == 4 and client.num_failures == 0
    assert slept == pytest.approx([0.01, 0.02, 0.04])
    assert seen[0] == {"queries": ["q1", "q2"], "topk": 4, "return_scores": True}


def test_500_twice_then_success_counts_three_requests():
    ok = {"result": [[{"document": {"id": "x", "contents": '"x"\ny'}, "score": 1.0}]]}
    app, seen = _scripted_app([(500, "e1"), (500, "e2"), (200, ok)])
    server, base = serve_in_thread(app)
    try:
        client = HTTPRetriever(base + "/retrieve", max_retries=2, backoff_s=0.0)
        assert client.search(["q"], topk=1) == [[SearchHit("x", '"x"\ny', 1.0)]]
        assert client.num_requests == 3 and len(seen) == 3
        # With one retry fewer the same server would have exhausted the budget.
        app2, _ = _scripted_app([(500, "e1"), (500, "e2"), (200, ok)])
        server2, base2 = serve_in_thread(app2)
        short = HTTPRetriever(base2 + "/retrieve", max_retries=1, backoff_s=0.0)
        with pytest.raises(RetrievalError, match=r"2 attempts.*HTTP 500"):
            short.search(["q"], topk=1)
        server2.should_exit = True
    finally:
        server.should_exit = True


def test_wrong_result_length_is_retried_then_fails():
    app, seen = _scripted_app([(200, {"result": []})])
    server, base = serve_in_thread(app)
    try:
        client = HTTPRetriever(base + "/retrieve", max_retries=1, backoff_s=0.0)
        with pytest.raises(RetrievalError, match="malformed response"):
            client.search(["q"], topk=1)
        assert len(seen) == 2
    finally:
        server.should_exit = True


@pytest.mark.parametrize("doc", [{"contents": "no id here"}, {"id": "", "contents": "empty id"},
                                 {"id": None, "contents": "null id"}])
def test_a_hit_without_an_id_is_refused_naming_the_server(doc):
    """Once: a hit without an id is the server's bug, not an outage, and every report citing from it would be
    invalid under reward.citations=retrieved (it used to become id "", silently)."""
    from score_lightning.errors import RetrieverUnavailable

    app, seen = _scripted_app([(200, {"result": [[{"document": doc, "score": 1.0}]]})])
    server, base = serve_in_thread(app)
    try:
        client = HTTPRetriever(base + "/retrieve", max_retries=3, backoff_s=0.0)
        with pytest.raises(RetrieverUnavailable, match=rf"retriever at {base}/retrieve returned a hit without an id"):
            client.search(["q"], topk=1)
        assert len(seen) == 1  # not retried
    finally:
        server.should_exit = True


# ------------------------------------------------------------------------------ factory, script


def test_factory(corpus_path):
    r = build_retriever("bm25", corpus_path=corpus_path)
    assert isinstance(r, BM25Retriever) and r.search(["LRU cache decorator"], 1)[0][0].id == "functools.lru_cache"
    h = build_retriever("http", url="http://127.0.0.1:1/retrieve", max_retries=5)
    assert isinstance(h, HTTPRetriever) and h.max_retries == 5
    with pytest.raises(ValueError, match=r"retriever\.kind.*'bm25', 'http'.*'faiss'"):
        build_retriever("faiss")
    with pytest.raises(ValueError, match="retriever.url"):
        build_retriever("http", url="localhost:8000")


def test_serve_script_end_to_end(corpus_path, bm25, tmp_path):
    port = _free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "serve_retriever.py"), "--corpus", str(corpus_path),
         "--index-dir", str(tmp_path / "idx"), "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
    )
    try:
        deadline = time.monotonic() + 25
        while True:
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).ok:
                    break
            except requests.ConnectionError:
                pass
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline, "server script did not come up"
            time.sleep(0.1)
        client = HTTPRetriever(f"http://127.0.0.1:{port}/retrieve")
        assert client.search(["LRU cache decorator"], 3) == bm25.search(["LRU cache decorator"], 3)
        assert (tmp_path / "idx" / META_FILE).is_file()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
