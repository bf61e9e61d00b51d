"""``retriever=mcp``: search through an MCP tool (the official SDK), over streamable HTTP against
``scripts/serve_mcp_search.py`` and over stdio against a server written here with other tool and argument names
and JSON-text results. Real training runs with the scripted engine (the solver searches and cites, the
evaluator's verification searches go through the same retriever); a dead server is refused in seconds; an
outage mid-run is counted and the run finishes."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import FAST, ROOT, compose
from score_lightning.errors import RetrieverUnavailable
from score_lightning.retrieval.base import RetrievalError
from score_lightning.retrieval.mcp import MADE_UP_ID_PREFIX, MCPRetriever
from score_lightning.rollout.scripted import ScriptedEngine, ScriptRequest
from test_grounded_rewards import DIMS, OBS_ID, RUBRIC, _report

STDIO_SERVER = '''
import json, sys
try:
    from mcp.server.fastmcp import FastMCP  # mcp 1.x
except ImportError:
    from mcp.server.mcpserver import MCPServer as FastMCP  # mcp 2.x

docs = [json.loads(line) for line in open(sys.argv[1], encoding="utf-8") if line.strip()]
server = FastMCP("other-names")


@server.tool(name="lookup", structured_output=False)
def lookup(text: str, limit: int = 3) -> str:
    """Passages sharing the most words with the text, as a JSON list of {doc_id, title, passage}."""
    words = set(text.lower().split())
    ranked = sorted(docs, key=lambda d: -len(words & set(d["contents"].lower().split())))[:limit]
    return json.dumps([{"doc_id": d["id"], "title": d["contents"].split("\\n", 1)[0].strip('"'),
                        "passage": d["contents"].split("\\n", 1)[-1]} for d in ranked])


server.run(transport="stdio")
'''


SHAPES_SERVER = '''
import json, sys, threading
try:
    from mcp.server.fastmcp import FastMCP  # mcp 1.x
except ImportError:
    from mcp.server.mcpserver import MCPServer as FastMCP  # mcp 2.x

docs = [json.loads(line) for line in open(sys.argv[1], encoding="utf-8") if line.strip()]
mode, calls, lock = sys.argv[2], [0], threading.Lock()
server = FastMCP("as-they-are")


def ranked(query, topk):
    words = set(query.lower().split())
    return sorted(docs, key=lambda d: -len(words & set(d["contents"].lower().split())))[:topk]


if mode == "json_text":
    @server.tool(name="search")
    def search(query: str, topk: int = 3) -> str:
        """Hits as JSON text, which the SDK sends as the structured content {"result": "<json>"}."""
        return json.dumps([{"url": d["id"], "title": d["contents"].split("\\n", 1)[0].strip('"'),
                            "snippet": d["contents"].split("\\n", 1)[-1]} for d in ranked(query, topk)])
elif mode == "prose":
    @server.tool(name="search", structured_output=False)
    def search(query: str, topk: int = 3) -> list[str]:
        """One text block of prose per hit, without ids."""
        return [d["contents"].split("\\n", 1)[-1] for d in ranked(query, topk)]
else:
    @server.tool(name="search")
    def search(query: str, topk: int = 3) -> dict:
        """Every second call fails (and is written down in argv[3])."""
        with lock:
            calls[0] += 1
            if calls[0] % 2 == 0:
                with open(sys.argv[3], "a") as log:
                    log.write(str(calls[0]) + "\\n")
                raise RuntimeError("every second call fails")
        return {"results": [{"id": d["id"], "contents": d["contents"]} for d in ranked(query, topk)]}


server.run(transport="stdio")
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(corpus_file: Path, index_dir: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "serve_mcp_search.py"), "--port", str(port),
                             "--corpus", str(corpus_file), "--index-dir", str(index_dir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        probe = MCPRetriever(url=url, connect_timeout_s=2.0, max_retries=0)
        try:
            probe.search(["probe"], 1)
            return proc, url
        except RetrievalError:
            time.sleep(0.5)
        finally:
            probe.close()
    proc.kill()
    raise RuntimeError("scripts/serve_mcp_search.py did not start")


@pytest.fixture(scope="module")
def mcp_server(corpus_file, tmp_path_factory):
    proc, url = _serve(corpus_file, tmp_path_factory.mktemp("mcp-index"))
    yield url
    proc.kill()
    proc.wait()


def respond(req: ScriptRequest) -> str:
    """The solver searches once and cites what it saw (nothing when the search failed); the evaluator verifies
    with one search, then scores."""
    if req.role == "rubric":
        return RUBRIC
    if req.turn == 0:
        return "<think>look it up</think><search>" + " ".join(req.query.split()[:3]) + "</search>"
    if req.role == "solver":
        seen = OBS_ID.search(req.context)
        cite = f" [{seen.group(1)}]" if seen else ""
        return f"<answer>A report on the question{cite}, from what the search showed. Conclusion: done.</answer>"
    return "<report_evaluations>" + _report(1, (7, 5, 3)) + "</report_evaluations>"


def _train(tmp_path, retriever: list[str], steps: int = 3, callbacks=()):
    from score_lightning.launch.training import run

    cfg = compose(FAST + [f"paths.output_dir={tmp_path}", f"trainer.max_steps={steps}", "optim.warmup_steps=0",
                          "harness.every_n_steps=10", "verifier.min_search_depth=1", "evaluator.max_tool_calls=1",
                          "solver.max_response_tokens=160", "evaluator.max_response_tokens=400",
                          "evaluator.max_rubric_tokens=96", "reward.require_citation=true", "retriever=mcp",
                          "retriever.timeout_s=5", "retriever.connect_timeout_s=3", *retriever])
    out: dict = {"steps": []}
    import lightning as L

    class Keep(L.Callback):
        def on_train_batch_end(self, trainer, module, *args):
            out["steps"].append(module.last_step)
            out["retriever"] = module.retriever

    def install(module):
        module.engine = module.evaluator_engine = ScriptedEngine(module.tokenizer, respond)

    run(cfg, extra_callbacks=[Keep(), *callbacks], module_hook=install)
    return out


def _check_searches(out) -> None:
    assert len(out["steps"]) == 3 and isinstance(out["retriever"], MCPRetriever)
    for step in out["steps"]:
        ro, rw = step["rollouts"], step["rewards"]
        assert all(t.retrieved_ids for t in ro.solver)  # the solver's searches went through the MCP tool
        assert all(len(t.search_queries) == 1 for t in ro.scoring)  # so did the evaluator's verification
        assert rw.validity.sum() == len(ro.solver) and rw.rewards.min() > 1.0  # cited what it retrieved: valid
        assert step["metrics"]["rollout/retrieval_errors_step"] == 0


def test_documents_from_structured_content_or_json_text_and_a_result_without_an_id_is_refused():
    r = MCPRetriever(url="http://127.0.0.1:9/mcp")
    hits = r.documents({"results": [{"id": "a", "contents": '"A"\nalpha', "score": 2.0},
                                    {"id": "b", "contents": "beta"}]}, 5)
    assert [(h.id, h.title, h.text, h.score) for h in hits] == [("a", "A", "alpha", 2.0), ("b", "", "beta", -1.0)]
    tulu = MCPRetriever(url="http://127.0.0.1:9/mcp", fields={"results": "organic", "id": "link", "text": "snippet"})
    serper = {"organic": [{"title": "T", "link": "https://x.org/1", "snippet": "s1"}, {"link": "https://x.org/2"}]}
    assert [(h.id, h.contents) for h in tulu.documents(serper, 1)] == [("https://x.org/1", '"T"\ns1')]
    assert [h.id for h in r.documents([{"doc_id": 7, "passage": "p"}], 3)] == ["7"]  # JSON text: a bare list
    with pytest.raises(RetrieverUnavailable, match=r"the MCP server http://127.0.0.1:9/mcp returned a result without an id"):
        r.documents({"data": [{"title": "no id", "text": "t"}]}, 3)
    with pytest.raises(RetrievalError, match="no list of results"):
        r.documents({"answer": "text"}, 3)


def test_trains_three_steps_against_serve_mcp_search(tmp_path, tiny_ckpt, corpus_file, mcp_server):
    out = _train(tmp_path, [f"retriever.url={mcp_server}"])
    _check_searches(out)
    assert out["retriever"].client.tool == "search" and out["retriever"].client.num_calls > 0


def test_trains_three_steps_against_a_stdio_server_with_other_names(tmp_path, tiny_ckpt, corpus_file):
    server = tmp_path / "other_server.py"
    server.write_text(STDIO_SERVER)
    out = _train(tmp_path, ["retriever.url=null", f"retriever.command=[{sys.executable},{server},{corpus_file}]",
                            "retriever.tool=lookup", "retriever.query_arg=text", "retriever.topk_arg=limit"])
    _check_searches(out)
    assert out["retriever"].client.tools == ["lookup"]
    assert any(h.text for h in out["retriever"].search(["json"], 2)[0])  # {doc_id, title, passage} became hits
    out["retriever"].close()


def _shapes_server(tmp_path, corpus_file, mode: str, *args: str) -> list[str]:
    server = tmp_path / "shapes_server.py"
    server.write_text(SHAPES_SERVER)
    argv = ",".join(map(str, [sys.executable, server, corpus_file, mode, *args]))
    return ["retriever.url=null", f"retriever.command=[{argv}]"]


@pytest.mark.parametrize("mode", ["json_text", "prose"])
def test_trains_three_steps_against_servers_returning_json_text_or_prose(tmp_path, tiny_ckpt, corpus_file, mode):
    from test_mcp_faults import _server_pids

    out = _train(tmp_path, _shapes_server(tmp_path, corpus_file, mode))
    _check_searches(out)
    ids = {d for step in out["steps"] for t in step["rollouts"].solver for d in t.retrieved_ids}
    made_up = {d for d in ids if d.startswith(MADE_UP_ID_PREFIX)}
    assert made_up == (ids if mode == "prose" else set())  # prose has no ids: made up here, recognisably
    assert (out["retriever"].num_made_up_ids > 0) == (mode == "prose")
    assert _server_pids("shapes_server.py") == []  # the run closed the server it started


def test_a_failed_call_fails_its_own_search_only_in_a_run(tmp_path, tiny_ckpt, corpus_file):
    failures = tmp_path / "failed_calls.txt"
    out = _train(tmp_path, [*_shapes_server(tmp_path, corpus_file, "every_second_fails", str(failures)),
                            "retriever.max_retries=0"])
    for step in out["steps"]:  # the solver's two searches are one batch of two calls: one of them fails
        solver = step["rollouts"].solver
        assert sorted(t.retrieval_errors for t in solver) == [0, 1]
        assert [bool(t.retrieved_ids) for t in solver].count(True) == 1
    errors = sum(s["metrics"]["rollout/retrieval_errors_step"] for s in out["steps"])
    assert errors == len(failures.read_text().split()) > 0  # each failed call counted once, no other


def test_a_dead_server_is_refused_in_seconds(tmp_path, tiny_ckpt, corpus_file):
    from score_lightning.launch.training import run

    for retriever in ([f"retriever.url=http://127.0.0.1:{_free_port()}/mcp"],
                      ["retriever.url=null", f"retriever.command=[{sys.executable},-c,pass]"]):
        cfg = compose(FAST + [f"paths.output_dir={tmp_path}", "retriever=mcp", "retriever.connect_timeout_s=2",
                              *retriever])
        t0 = time.monotonic()
        with pytest.raises(RetrieverUnavailable, match="unreachable") as err:
            run(cfg)
        assert time.monotonic() - t0 < 10
    assert "check that the command starts an MCP server" in str(err.value)


def test_an_outage_mid_run_is_counted_and_the_run_finishes(tmp_path, tiny_ckpt, corpus_file):
    import lightning as L

    proc, url = _serve(corpus_file, tmp_path / "index")

    class Outage(L.Callback):  # the server dies after the first step
        def on_train_batch_end(self, *args):
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    try:
        out = _train(tmp_path, [f"retriever.url={url}", "retriever.max_retries=0"], callbacks=[Outage()])
    finally:
        proc.kill()
    errors = [s["metrics"]["rollout/retrieval_errors_step"] for s in out["steps"]]
    assert len(errors) == 3 and errors[0] == 0 and errors[1] > 0 and errors[2] > 0
    later = out["steps"][2]["rollouts"]
    assert not any(t.retrieved_ids for t in later.solver)  # nothing retrieved, nothing citable: counted, not fatal
    assert out["retriever"].num_failures > 0
