"""A loopback OpenAI-compatible chat-completions server for tests (meta-harness, LLM judges, ...).

It is a real HTTP server (``ThreadingHTTPServer`` on 127.0.0.1, port 0, daemon thread), so the
code under test exercises its actual client path (the ``openai`` SDK over httpx): headers,
timeouts, status codes, the SDK's own retries (``x-stainless-retry-count`` says which try it is).

Usage::

    with OpenAIStub(content='{"notes": "hi"}') as stub:
        client(base_url=stub.base_url)           # http://127.0.0.1:<port>/v1
        stub.script(Reply(status=500), Reply(content="ok"))   # next two replies, then the default
        stub.requests[0].json["model"], stub.requests[0].headers["Authorization"]

``stub.in_flight_max`` is the most chat requests the server held at once (received, not yet answered).

or with the ``openai_stub`` pytest fixture (``from openai_stub import openai_stub`` in a test module).

Each reply is taken from the scripted queue first, else from the defaults (``content``,
``status``, ``delay_s``). ``content`` may be a callable ``(request_json) -> str`` for replies that
depend on the prompt (e.g. a judge that echoes a score per report); it may also return a
:class:`Reply` (``Reply(status=500)``, ``Reply(content=..., finish_reason="length")``) to fail the
requests it picks, whatever order concurrent requests arrive in.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator, Union

import pytest

Content = Union[str, Callable[[dict[str, Any]], str]]


@dataclass
class Reply:
    """One scripted reply. ``body`` (raw bytes/str) overrides the OpenAI-shaped JSON entirely."""

    content: Content | None = None
    status: int = 200
    delay_s: float = 0.0
    body: bytes | str | None = None
    finish_reason: str = "stop"
    headers: dict[str, str] = field(default_factory=dict)  # extra response headers, e.g. {"Retry-After": "0.2"}


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    json: Any  # parsed body, or None when the body was not JSON
    raw: bytes = b""
    received_at: float = field(default_factory=time.monotonic)

    def header(self, name: str) -> str | None:
        """Case-insensitive header lookup."""
        return next((v for k, v in self.headers.items() if k.lower() == name.lower()), None)


class OpenAIStub:
    """Scriptable fake of ``POST /v1/chat/completions`` (and ``GET /v1/models``)."""

    def __init__(self, content: Content = "", status: int = 200, delay_s: float = 0.0, model: str = "stub-model"):
        self.content: Content = content
        self.status = status
        self.delay_s = delay_s
        self.model = model
        self.requests: list[RecordedRequest] = []
        self._queue: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._stop = threading.Event()  # wakes handlers sleeping in a delay when the stub stops
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._counter = 0
        self.in_flight = 0
        self.in_flight_max = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "OpenAIStub":
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep pytest output clean
                pass

            def do_GET(self) -> None:
                stub._record(self, b"")
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": [{"id": stub.model, "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                request = stub._record(self, raw)
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                with stub._lock:
                    stub.in_flight += 1
                    stub.in_flight_max = max(stub.in_flight_max, stub.in_flight)
                self._held = True
                try:
                    self._answer(request)
                finally:
                    self._release()

            def _release(self) -> None:
                """The request stops being in flight once: before its reply's first byte is written (a client
                that reads the reply may send its next request at once, and this thread's bookkeeping must not
                count that overlap), or when the handler ends without replying."""
                if getattr(self, "_held", False):
                    self._held = False
                    with stub._lock:
                        stub.in_flight -= 1

            def _answer(self, request: RecordedRequest) -> None:
                reply, text = stub._resolve(stub._next_reply(), request.json)
                if reply.delay_s > 0 and not self._wait(reply.delay_s):
                    return  # stub stopped, or the client hung up, while delaying
                if reply.body is not None:
                    body = reply.body.encode() if isinstance(reply.body, str) else reply.body
                    self._send_bytes(reply.status, body, reply.headers)
                elif reply.status >= 400:
                    self._send(reply.status, {"error": {"message": f"stub error {reply.status}", "type": "stub"}},
                               reply.headers)
                else:
                    self._send(reply.status, stub._completion(request.json, text, reply.finish_reason), reply.headers)

            def _wait(self, seconds: float) -> bool:
                """Sleep ``seconds``; False as soon as the stub stops or the client closes the connection
                (a client that timed out is no longer waiting: its request is no longer in flight)."""
                end = time.monotonic() + seconds
                while (left := end - time.monotonic()) > 0:
                    if stub._stop.wait(min(left, 0.02)):
                        return False
                    try:
                        ready, _, _ = select.select([self.connection], [], [], 0)
                        if ready and not self.connection.recv(1, socket.MSG_PEEK):
                            return False
                    except OSError:
                        return False
                return True

            def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
                self._send_bytes(status, json.dumps(payload).encode(), headers)

            def _send_bytes(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
                self._release()
                try:
                    self.send_response(status)
                    for name, value in (headers or {}).items():
                        self.send_header(name, value)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):  # client timed out and left
                    pass

        self._stop.clear()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="openai-stub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "OpenAIStub":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------------ configuration
    @property
    def base_url(self) -> str:
        """OpenAI-style base URL, e.g. ``http://127.0.0.1:54321/v1``."""
        assert self._server is not None, "stub not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def script(self, *replies: Reply | str) -> None:
        """Queue replies (a plain string is a 200 reply with that content), served before the defaults."""
        with self._lock:
            self._queue.extend(Reply(content=r) if isinstance(r, str) else r for r in replies)

    def reset(self) -> None:
        """Forget recorded requests and scripted replies (defaults stay)."""
        with self._lock:
            self.requests.clear()
            self._queue.clear()

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path.rstrip("/").endswith("/chat/completions")]

    # ------------------------------------------------------------------ internals
    def _record(self, handler: BaseHTTPRequestHandler, raw: bytes) -> RecordedRequest:
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = None
        request = RecordedRequest(handler.command, handler.path, dict(handler.headers.items()), parsed, raw)
        with self._lock:
            self.requests.append(request)
        return request

    def _next_reply(self) -> Reply:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
        return Reply(content=None, status=self.status, delay_s=self.delay_s)

    def _resolve(self, reply: Reply, request: Any) -> tuple[Reply, str]:
        """The reply to send and its text; a callable ``content`` may return a whole :class:`Reply`
        (an HTTP error, a delay, a cut reply) chosen from the request, so failures need no ordering."""
        if reply.body is not None or reply.status >= 400:
            return reply, ""
        content = reply.content if reply.content is not None else self.content
        value = content(request) if callable(content) else content
        if isinstance(value, Reply):
            if callable(value.content):
                raise TypeError("a Reply returned by a content callable needs a str content")
            return value, value.content or ""
        return reply, value

    def _completion(self, request: Any, text: str, finish_reason: str) -> dict[str, Any]:
        with self._lock:
            self._counter += 1
            n = self._counter
        model = request.get("model", self.model) if isinstance(request, dict) else self.model
        return {
            "id": f"chatcmpl-stub-{n}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish_reason}
            ],
            "usage": {"prompt_tokens": 0, "completion_tokens": len(text.split()), "total_tokens": len(text.split())},
        }


@pytest.fixture
def openai_stub() -> Iterator[OpenAIStub]:
    """A started stub, stopped after the test."""
    with OpenAIStub() as stub:
        yield stub
