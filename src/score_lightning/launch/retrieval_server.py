"""A Search-R1-compatible retrieval server, so several training nodes share one index.

The server is reachable by other machines, so it bounds what a single request may cost (body
bytes, number of queries, query length, topk) and can require a bearer token. Both checks happen
before the search runs: a bad token is answered 401 and an oversized body 413 before the body is
even parsed, and out-of-range fields 422, each with a ``detail`` message naming the limit and the
value.
"""

# No ``from __future__ import annotations``: FastAPI must see the per-app request model (a local
# class) as a real annotation, not as a string it would look up in the module's globals.
import hmac
import ipaddress
import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Annotated, Any

import fastapi
import uvicorn
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, StringConstraints

from score_lightning.retrieval.base import Retriever

#: Environment variable holding the shared bearer token (read by the server script and the client).
TOKEN_ENV = "SCORE_RETRIEVER_TOKEN"
#: Paths that answer without a token: liveness probes must not need the secret.
OPEN_PATHS = frozenset({"/health"})


@dataclass(frozen=True)
class ServerLimits:
    """Per-request bounds; the defaults fit Search-R1 batches (a rollout step sends one query per
    active rollout, topk <= 10) with a wide margin, while one request stays well under a second.

    ``max_body_bytes`` covers the worst case of the other limits: 256 queries x 2,000 characters,
    each character JSON-escaped as ``\\uXXXX`` (6 bytes), is about 3 MiB.
    """

    max_queries: int = 256
    max_query_chars: int = 2000
    min_topk: int = 1
    max_topk: int = 100
    max_body_bytes: int = 4 * 2**20

    def __post_init__(self) -> None:
        for name in ("max_queries", "max_query_chars", "min_topk", "max_topk", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.min_topk > self.max_topk:
            raise ValueError(f"min_topk ({self.min_topk}) must be <= max_topk ({self.max_topk})")


def request_model(limits: ServerLimits) -> type[BaseModel]:
    """The ``/retrieve`` body schema with ``limits`` as pydantic constraints (built per app, since
    the limits are server options)."""
    Query = Annotated[str, StringConstraints(max_length=limits.max_query_chars)]

    class RetrieveRequest(BaseModel):
        queries: list[Query] = Field(max_length=limits.max_queries)
        topk: int = Field(default=3, ge=limits.min_topk, le=limits.max_topk, strict=True)
        return_scores: bool = Field(default=False, strict=True)

    return RetrieveRequest


RetrieveRequest = request_model(ServerLimits())  # the default schema, for reference and imports


def _describe(err: dict[str, Any], limits: ServerLimits) -> str:
    """One readable line per validation error: the field, the value and the limit it broke."""
    loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
    kind, value = err.get("type", ""), err.get("input")
    if kind == "string_too_long" and isinstance(value, str):
        return f"{loc}: query is {len(value)} characters, the limit is {limits.max_query_chars} (max_query_chars)"
    if kind == "too_long" and isinstance(value, list):
        return f"{loc}: {len(value)} queries, the limit is {limits.max_queries} per request (max_queries)"
    if loc == "topk" and kind in ("greater_than_equal", "less_than_equal"):
        return f"topk: {value!r} is outside the allowed range {limits.min_topk}..{limits.max_topk}"
    shown = repr(value)
    return f"{loc}: {err.get('msg', 'invalid')} (got {shown[:80] + '...' if len(shown) > 80 else shown})"


class RequestGuard:
    """ASGI middleware: bearer token (401), then body size (413), before FastAPI reads the body.

    FastAPI would parse and validate the body before a dependency could check the token, so an
    unauthenticated client could probe the schema (422) or make the server buffer a large body;
    here neither happens. The body is read at most ``max_body_bytes`` into memory, then replayed.
    """

    def __init__(self, app: Any, token: str | None, max_body_bytes: int) -> None:
        self.app = app
        self.token = token.encode() if token else None
        self.max_body_bytes = int(max_body_bytes)

    @staticmethod
    async def _reply(send: Any, status: int, detail: str, extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        body = json.dumps({"detail": detail}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close"), *extra]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        scheme, _, value = headers.get(b"authorization", b"").partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(value.strip(), self.token or b"")

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", ()))
        if self.token is not None and scope["path"] not in OPEN_PATHS and not self._authorized(headers):
            await self._reply(send, 401, f"unauthorized: missing or wrong bearer token; send 'Authorization: "
                                         f"Bearer <token>' (the client reads it from {TOKEN_ENV})",
                              ((b"www-authenticate", b"Bearer"),))
            return
        limit = self.max_body_bytes
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._reply(send, 413, f"request body is {int(declared)} bytes; the limit is {limit} bytes "
                                         "(max_body_bytes)")
            return
        chunks, size = [], 0
        while True:  # bounded read, which also catches chunked bodies without a Content-Length
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > limit:
                await self._reply(send, 413, f"request body exceeds the limit of {limit} bytes (max_body_bytes)")
                return
            chunks.append(chunk)
            if not msg.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # later calls wait for the disconnect, as the app expects

        await self.app(scope, replay, send)


def make_app(retriever: Retriever, limits: ServerLimits | None = None, token: str | None = None) -> fastapi.FastAPI:
    """``POST /retrieve`` (Search-R1 API) and ``GET /health`` around any ``Retriever``.

    ``limits`` bound each request (413/422); with ``token`` every path but ``/health`` needs
    ``Authorization: Bearer <token>`` (401).
    """
    limits = limits or ServerLimits()
    Body = request_model(limits)
    app = fastapi.FastAPI(title="score-lightning retriever")
    app.add_middleware(RequestGuard, token=token, max_body_bytes=limits.max_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: fastapi.Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        return JSONResponse(status_code=422, content={
            "detail": "; ".join(_describe(e, limits) for e in errors),
            "errors": [{"loc": list(e.get("loc", ())), "type": e.get("type"), "msg": e.get("msg")} for e in errors],
        })

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "num_docs": len(retriever) if hasattr(retriever, "__len__") else None}

    @app.post("/retrieve")
    async def retrieve(req: Body) -> dict:  # type: ignore[valid-type]
        # The search is CPU-bound; run it in the threadpool so the event loop keeps accepting
        # connections and answering /health while concurrent requests queue for the index.
        hits = await run_in_threadpool(retriever.search, req.queries, req.topk)
        if req.return_scores:
            result = [[{"document": {"id": h.id, "contents": h.contents}, "score": h.score} for h in q]
                      for q in hits]
        else:
            result = [[{"id": h.id, "contents": h.contents} for h in q] for q in hits]
        return {"result": result}

    return app


def is_loopback(host: str) -> bool:
    """True when ``host`` only accepts connections from this machine (``localhost``, 127.0.0.0/8, ::1)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a hostname or "": may resolve to a public interface


def check_exposure(host: str, token: str | None, allow_unauthenticated: bool = False) -> None:
    """Refuse to serve the index to the network without a token, unless explicitly allowed."""
    if token or allow_unauthenticated or is_loopback(host):
        return
    raise SystemExit(
        f"refusing to serve on {host!r} without a token: anyone who can reach it could use the server. "
        f"Set {TOKEN_ENV} (or pass --token) and give the clients the same value, or bind 127.0.0.1, "
        "or pass --allow-unauthenticated on a trusted network."
    )


def token_from_env(explicit: str | None = None) -> str | None:
    """``explicit`` if given, else ``$SCORE_RETRIEVER_TOKEN``; an empty value means no token."""
    token = explicit if explicit is not None else os.environ.get(TOKEN_ENV)
    return token or None


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
