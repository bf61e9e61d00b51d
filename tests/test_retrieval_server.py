"""The shared retrieval server's limits (413/422) and bearer token (401), against real servers on loopback."""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from score_lightning.retrieval.base import RetrievalError
from score_lightning.retrieval.http import HTTPRetriever
from score_lightning.launch.retrieval_server import (
    TOKEN_ENV, ServerLimits, check_exposure, is_loopback, make_app, serve_in_thread, token_from_env,
)

REPO = Path(__file__).resolve().parents[1]
TOKEN = "s3cret-token"
LIMITS = ServerLimits(max_queries=4, max_query_chars=50, min_topk=1, max_topk=10, max_body_bytes=2000)


@pytest.fixture(scope="module")
def limited(bm25):
    """A server with small limits and no token."""
    server, base = serve_in_thread(make_app(bm25, limits=LIMITS))
    yield base + "/retrieve"
    server.should_exit = True


@pytest.fixture(scope="module")
def guarded(bm25):
    """A server with the default limits and a token."""
    server, base = serve_in_thread(make_app(bm25, token=TOKEN))
    yield base
    server.should_exit = True


def _post(url: str, body: dict, **kw) -> requests.Response:
    return requests.post(url, json=body, timeout=10, **kw)


# ------------------------------------------------------------------------------------------ limits


def test_within_limits_is_served(limited, bm25):
    body = _post(limited, {"queries": ["LRU cache decorator"] * 4, "topk": 10, "return_scores": True}).json()
    assert len(body["result"]) == 4
    assert [e["document"]["id"] for e in body["result"][0]] == [h.id for h in bm25.search(["LRU cache decorator"], 10)[0]]


def test_oversized_body_is_413(limited):
    r = _post(limited, {"queries": ["x" * 3000], "topk": 3})
    assert r.status_code == 413
    assert r.json()["detail"].startswith("request body is ") and "limit is 2000 bytes" in r.json()["detail"]


def test_oversized_chunked_body_is_413(limited):
    """Without a Content-Length the server counts the bytes as they arrive.

    The server answers 413 as soon as the limit is crossed and closes with the rest of the body unread,
    so TCP may reset the connection before the client reads the answer (a race of the transport, not
    of the server): such an attempt is repeated. Any answer read must be the 413.
    """
    host, port = limited.removeprefix("http://").split("/")[0].split(":")
    pieces = (b'{"queries": ["', b"y" * 1500, b"y" * 1500, b'"], "topk": 3}')
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    answers = []
    for _ in range(5):
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            conn.putrequest("POST", "/retrieve")
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Transfer-Encoding", "chunked")
            conn.endheaders()
            try:
                conn.send(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # answered and closed before the body ended; the answer may still be readable
            resp = conn.getresponse()
            answers.append((resp.status, resp.read()))
            break
        except (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected):
            continue
        finally:
            conn.close()
    assert answers, "every attempt was reset before an answer could be read"
    status, text = answers[0]
    assert status == 413 and b"exceeds the limit of 2000 bytes" in text


@pytest.mark.parametrize("body, expected", [
    ({"queries": ["x"], "topk": 0}, "topk: 0 is outside the allowed range 1..10"),
    ({"queries": ["x"], "topk": 11}, "topk: 11 is outside the allowed range 1..10"),
    ({"queries": ["x"], "topk": "3"}, "topk: Input should be a valid integer"),
    ({"queries": ["x"], "topk": 2.5}, "topk: Input should be a valid integer"),
    ({"queries": ["ok", "z" * 51], "topk": 3}, "queries.1: query is 51 characters, the limit is 50"),
    ({"queries": ["q"] * 5, "topk": 3}, "queries: 5 queries, the limit is 4 per request"),
    ({"queries": "x", "topk": 3}, "queries: Input should be a valid list"),
    ({"queries": [1], "topk": 3}, "queries.0: Input should be a valid string"),
    ({"topk": 3}, "queries: Field required"),
])
def test_invalid_fields_are_422_naming_limit_and_value(limited, body, expected):
    r = _post(limited, body)
    assert r.status_code == 422, r.text
    assert expected in r.json()["detail"], r.json()
    assert r.json()["errors"] and "input" not in r.json()["errors"][0]  # a long query is not echoed back


def test_client_sees_the_limit_and_does_not_retry(limited):
    client = HTTPRetriever(limited, max_retries=3, backoff_s=0.01, token="")
    slept: list[float] = []
    client._sleep = slept.append
    with pytest.raises(RetrievalError, match=r"HTTP 422.*not retried.*outside the allowed range 1\.\.10"):
        client.search(["x"], topk=50)
    assert client.num_requests == 1 and slept == []


def test_bad_limits_refused():
    with pytest.raises(ValueError, match="min_topk"):
        ServerLimits(min_topk=5, max_topk=3)
    with pytest.raises(ValueError, match="max_queries"):
        ServerLimits(max_queries=0)


# ------------------------------------------------------------------------------------------- token


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN},
                                     {"Authorization": f"Basic {TOKEN}"}, {"Authorization": f"Bearer {TOKEN}x"}])
def test_missing_or_wrong_token_is_401(guarded, headers):
    # An invalid body too: the token is checked first, so an outsider cannot probe the schema (422).
    for body in ({"queries": ["json"], "topk": 3}, {"queries": ["json"], "topk": 0}):
        r = _post(guarded + "/retrieve", body, headers=headers)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert "unauthorized" in r.json()["detail"] and TOKEN_ENV in r.json()["detail"]
    assert requests.get(guarded + "/openapi.json", headers=headers, timeout=10).status_code == 401


def test_correct_token_is_served(guarded, bm25):
    r = _post(guarded + "/retrieve", {"queries": ["LRU cache decorator"], "topk": 3},
              headers={"Authorization": f"bearer {TOKEN}"})  # the scheme is case-insensitive
    assert r.status_code == 200
    assert [e["id"] for e in r.json()["result"][0]] == [h.id for h in bm25.search(["LRU cache decorator"], 3)[0]]
    assert requests.get(guarded + "/health", timeout=10).json()["status"] == "ok"  # probes need no token


def test_client_token_argument_and_env(guarded, bm25, monkeypatch):
    url = guarded + "/retrieve"
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert HTTPRetriever(url, token=TOKEN).search(["heap queue"], 3) == bm25.search(["heap queue"], 3)
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    assert HTTPRetriever(url).search(["heap queue"], 3) == bm25.search(["heap queue"], 3)
    monkeypatch.setenv("MY_RETRIEVER_TOKEN", TOKEN)
    monkeypatch.delenv(TOKEN_ENV)
    assert HTTPRetriever(url, token_env="MY_RETRIEVER_TOKEN").search(["heap queue"], 3) == bm25.search(["heap queue"], 3)


def test_client_without_token_gets_a_clear_error_not_retries(guarded, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    client = HTTPRetriever(guarded + "/retrieve", max_retries=3, backoff_s=0.01)
    slept: list[float] = []
    client._sleep = slept.append
    with pytest.raises(RetrievalError, match=rf"HTTP 401 unauthorized: set {TOKEN_ENV}"):
        client.search(["json"], topk=3)
    assert client.num_requests == 1 and client.num_failures == 1 and slept == []
    with pytest.raises(RetrievalError, match="401 unauthorized"):
        HTTPRetriever(guarded + "/retrieve", token="wrong").search(["json"], topk=3)


# ------------------------------------------------------------------------------------ exposure


def test_loopback_detection_and_exposure_check():
    for host in ("127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"):
        assert is_loopback(host), host
        check_exposure(host, token=None)
    for host in ("0.0.0.0", "::", "", "10.0.0.5", "retriever.example.org"):
        assert not is_loopback(host), host
        with pytest.raises(SystemExit, match=f"refusing to serve on .*without a token.*{TOKEN_ENV}"):
            check_exposure(host, token=None)
        check_exposure(host, token="t")
        check_exposure(host, token=None, allow_unauthenticated=True)


def _serve_script(*args: str, env_token: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    if env_token is not None:
        env[TOKEN_ENV] = env_token
    return subprocess.run([sys.executable, str(REPO / "scripts" / "serve_retriever.py"), *args],
                          capture_output=True, text=True, timeout=60, env=env)


def test_script_refuses_0000_without_token():
    proc = _serve_script("--host", "0.0.0.0", "--port", "0")
    assert proc.returncode != 0
    assert "refusing to serve on '0.0.0.0' without a token" in proc.stderr
    assert "--allow-unauthenticated" in proc.stderr


def test_token_from_env(monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    assert token_from_env() == "from-env" and token_from_env("flag") == "flag"
    assert token_from_env("") is None  # an explicit empty token disables it
    monkeypatch.setenv(TOKEN_ENV, "")
    assert token_from_env() is None


def test_script_refuses_bad_limits():
    proc = _serve_script("--max-topk", "0")
    assert proc.returncode != 0 and "bad limit: max_topk must be >= 1" in proc.stderr
