"""A Search-R1-compatible retrieval server, so several training nodes share one index."""

from __future__ import annotations

import threading
import time

import fastapi
import uvicorn
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from score_lightning.retrieval.base import Retriever


class RetrieveRequest(BaseModel):
    queries: list[str]
    topk: int = Field(default=3, ge=1, le=100)
    return_scores: bool = False


def make_app(retriever: Retriever) -> fastapi.FastAPI:
    """``POST /retrieve`` (Search-R1 API) and ``GET /health`` around any ``Retriever``.

    Malformed bodies (queries not a list of strings, topk outside 1..100) get FastAPI's 422.
    """
    app = fastapi.FastAPI(title="score-lightning retriever")

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "num_docs": len(retriever) if hasattr(retriever, "__len__") else None}

    @app.post("/retrieve")
    async def retrieve(req: RetrieveRequest) -> dict:
        # The search is CPU-bound; run it off the event loop so /health stays responsive.
        hits = await run_in_threadpool(retriever.search, req.queries, req.topk)
        if req.return_scores:
            result = [[{"document": {"id": h.id, "contents": h.contents}, "score": h.score} for h in q]
                      for q in hits]
        else:
            result = [[{"id": h.id, "contents": h.contents} for h in q] for q in hits]
        return {"result": result}

    return app


def serve_in_thread(app: fastapi.FastAPI, host: str = "127.0.0.1", port: int = 0,
                    timeout_s: float = 10.0) -> tuple[uvicorn.Server, str]:
    """Run ``app`` with uvicorn in a daemon thread; return ``(server, base_url)`` once it listens.

    ``port=0`` picks a free port. Stop it with ``server.should_exit = True``.
    """
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="retriever-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError(f"retrieval server failed to start on {host}:{port}")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"retrieval server did not start on {host}:{port} within {timeout_s}s")
        time.sleep(0.01)
    bound_port = server.servers[0].sockets[0].getsockname()[1]
    return server, f"http://{host}:{bound_port}"
