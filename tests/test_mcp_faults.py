"""MCP tool servers as they are (issue 69), against real servers written here with the official SDK and launched
over stdio: a failed call fails its own query only (a slow one past its deadline, one whose tool raises), a server
that answers one call at a time is waited for while it keeps answering, ``close()`` ends the server it started,
and a payload of an unexpected shape is reported with its shape, never as an unreachable server."""

from __future__ import annotations

import sys
import time

import psutil
import pytest

from helpers import FAST, compose
from score_lightning.clients.mcp import payload_of
from score_lightning.errors import RetrieverUnavailable
from score_lightning.retrieval.base import RetrievalError, UnexpectedResult
from score_lightning.retrieval.mcp import MADE_UP_ID_PREFIX, MCPRetriever, made_up_id, shape

SERVER = '''
import asyncio, json, sys, threading, time
try:
    from mcp.server.fastmcp import FastMCP  # mcp 1.x
except ImportError:
    from mcp.server.mcpserver import MCPServer as FastMCP  # mcp 2.x

server = FastMCP("faults")
one_at_a_time = threading.Lock()


@server.tool(name="search")
async def search(query: str, topk: int = 3) -> str:
    """A JSON list of one hit; "slow" answers after 30 s, "fail" raises."""
    if query == "slow":
        await asyncio.sleep(30)
    if query == "fail":
        raise ValueError("this query breaks the tool")
    return json.dumps([{"id": "d-" + query, "contents": "about " + query}])


@server.tool(name="serial", structured_output=False)
def serial(query: str, topk: int = 3) -> str:
    """One call at a time, 0.25 s each (a server with one worker)."""
    with one_at_a_time:
        time.sleep(0.25)
    return json.dumps({"results": [{"id": "s-" + query, "contents": query}]})


@server.tool(name="answer")
def answer(query: str, topk: int = 3) -> dict:
    """Structured content with no list of results."""
    return {"answer": "an answer to " + query, "count": 3}


server.run(transport="stdio")
'''


@pytest.fixture
def server(tmp_path):
    path = tmp_path / "faults_server.py"
    path.write_text(SERVER)
    return [sys.executable, str(path)]


def _server_pids(script: str) -> list[int]:
    """The pids of this process's children running ``script``."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if script in " ".join(child.cmdline()):
                found.append(child.pid)
        except psutil.Error:
            pass
    return found


def test_a_slow_and_a_failing_call_fail_only_their_own_queries_and_close_ends_the_server(server):
    r = MCPRetriever(command=server, timeout_s=1.0, connect_timeout_s=20.0, max_retries=0)
    assert [h.id for h in r.search(["warm"], 3)[0]] == ["d-warm"]
    pids = _server_pids(server[1])
    assert len(pids) == 1
    t0 = time.monotonic()
    with pytest.raises(RetrievalError) as err:
        r.search(["a", "slow", "b", "fail", "c"], 3)
    assert time.monotonic() - t0 < 10  # the slow call's deadline, not its 30 s
    assert [h if h is None else [x.id for x in h] for h in err.value.hits] == [["d-a"], None, ["d-b"], None, ["d-c"]]
    assert "2 of 5 queries failed (timeout 1, tool_error 1" in str(err.value)
    assert r.num_failures == 2 and r.client.num_failures == 2  # only the failed queries count
    assert [h.id for h in r.search(["d"], 3)[0]] == ["d-d"] and r.client.num_connects == 1  # the session lived on
    r.close()
    assert not psutil.pid_exists(pids[0]) and _server_pids(server[1]) == []  # no orphan after close()


def test_a_server_answering_one_call_at_a_time_is_waited_for_while_it_answers(server):
    r = MCPRetriever(tool="serial", command=server, timeout_s=1.0, connect_timeout_s=20.0, max_retries=0)
    try:
        r.search(["warm"], 3)
        queries = [f"q{i}" for i in range(6)]  # 1.5 s in all, longer than timeout_s; each answer within it
        assert [[h.id for h in hits] for hits in r.search(queries, 3)] == [[f"s-{q}"] for q in queries]
        assert r.num_failures == 0
    finally:
        r.close()


def test_payloads_in_the_shapes_servers_send():
    hits = [{"id": "a", "contents": "x"}]
    assert payload_of({"results": hits}, ["ignored"]) == {"results": hits}  # structured content
    assert payload_of({"result": '[{"id": "a", "contents": "x"}]'}, []) == hits  # the SDK's wrapper of a str
    assert payload_of({"result": "Plain prose."}, ["Plain prose."]) == "Plain prose."
    assert payload_of(None, ['{"results": []}']) == {"results": []}  # JSON text
    assert payload_of(None, ["first hit", "second hit"]) == ["first hit", "second hit"]  # a text block per hit
    assert payload_of(None, ["42"]) == "42"  # a JSON scalar is text, not a result list
    r = MCPRetriever(url="http://127.0.0.1:9/mcp")
    prose = r.documents(["  ", "First passage.", "Second passage."], 5)
    assert [(h.id, h.text, h.score) for h in prose] == [(made_up_id("First passage."), "First passage.", 0.0),
                                                        (made_up_id("Second passage."), "Second passage.", -1.0)]
    assert prose[0].id.startswith(MADE_UP_ID_PREFIX) and r.num_made_up_ids == 2
    assert r.documents("One passage.", 5)[0].id == made_up_id("One passage.")  # the same text, the same id


def test_an_unexpected_shape_is_reported_with_its_shape():
    assert shape({"answer": "x", "meta": {"n": 1, "hits": [{"url": "u"}, {}]}}) == \
        "{answer: str, meta: {n: int, hits: [2 × {url: str}]}}"
    r = MCPRetriever(url="http://127.0.0.1:9/mcp")
    with pytest.raises(UnexpectedResult, match=r"a payload of shape \{answer: str, count: int\}"):
        r.documents({"answer": "text", "count": 3}, 3)
    with pytest.raises(UnexpectedResult, match="a result of shape int is neither an object nor text"):
        r.documents([7], 3)


def test_a_server_answering_in_an_unexpected_shape_is_not_called_unreachable(tmp_path, server):
    from score_lightning.launch.training import run

    cfg = compose(FAST + [f"paths.output_dir={tmp_path}", "retriever=mcp", "retriever.url=null",
                          f"retriever.command=[{server[0]},{server[1]}]", "retriever.tool=answer",
                          "retriever.connect_timeout_s=20"])
    with pytest.raises(RetrieverUnavailable) as err:
        run(cfg)
    message = str(err.value)
    assert "answered" in message and "{answer: str, count: int}" in message and "retriever.fields.results" in message
    assert "unreachable" not in message and "serve_mcp_search" not in message
    assert _server_pids(server[1]) == []  # the probe closed the server it started
