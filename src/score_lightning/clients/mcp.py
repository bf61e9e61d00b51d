"""A synchronous client of one MCP tool server, on the official ``mcp`` SDK (streamable HTTP or stdio).

DR Tulu's agent library serves its search, browse and paper tools over MCP, and open-instruct has a generic
MCP tool; this client lets the trainer call such a tool the way it calls every other retriever: a blocking
``call(arguments)`` per query, from whichever thread runs the agent loop.

* **Transport**: ``url`` (streamable HTTP, e.g. ``http://127.0.0.1:8002/mcp``) or ``command`` (stdio: the
  server's command line, started as a child process and stopped with the client).
* **One session**: the SDK is asynchronous; the client runs an event loop in a daemon thread and keeps one
  session open in a task of its own (an MCP session's streams must be opened and closed by the same task).
  Tool calls are submitted to that loop; a batch of queries runs concurrently (:meth:`MCPToolClient.call_many`).
* **Faults**: connecting (initialize, then ``tools/list`` to check that ``tool`` exists) is bounded by
  ``connect_timeout_s``, a call by ``timeout_s``. A failed call marks the session broken; the next call
  reconnects, so a server that comes back is used again. Every failure is an :class:`MCPError` naming the
  server, with a kind (``connect``, ``timeout``, ``tool_error``, ``bad_result``, ``no_tool``).
* **Results**: a tool's structured content (a JSON object) when it has one, else its text content parsed as
  JSON (several text blocks: a list of their values). Mapping that onto documents is the retriever's
  (``retrieval/mcp.py``).
"""

from __future__ import annotations

import asyncio
import functools
import importlib.metadata
import json
import shlex
import threading
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any


@functools.cache
def _mcp_major() -> int:
    return int(importlib.metadata.version("mcp").split(".", 1)[0])


def _read_timeout(seconds: float):
    """``call_tool``'s per-call read timeout: a timedelta in mcp 1.x, seconds in 2.x."""
    return timedelta(seconds=seconds) if _mcp_major() < 2 else float(seconds)


class MCPError(RuntimeError):
    """A tool call (or the connection it needed) failed; ``kind`` says how, the message names the server."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def command_line(command: str | Sequence[str]) -> list[str]:
    """``retriever.command`` as argv: a list as it is, a string split like a shell would."""
    argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    if not argv:
        raise ValueError("an MCP stdio command needs at least the executable")
    return argv


class MCPToolClient:
    """One MCP server and one of its tools; thread-safe, reconnects after a failure."""

    def __init__(self, tool: str, url: str | None = None, command: str | Sequence[str] | None = None, *,
                 timeout_s: float = 10.0, connect_timeout_s: float = 5.0, env: Mapping[str, str] | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        if (url is None) == (command is None):
            raise ValueError("an MCP server is either a url (streamable HTTP) or a command (stdio), not both or neither")
        if url is not None and not str(url).startswith(("http://", "https://")):
            raise ValueError(f"an MCP url must start with http:// or https://, got {url!r}")
        self.tool, self.url = tool, url
        self.argv = command_line(command) if command is not None else None
        self.server = url if url is not None else " ".join(self.argv)
        self.timeout_s, self.connect_timeout_s = float(timeout_s), float(connect_timeout_s)
        self.env = dict(env) if env else None
        self.headers = dict(headers) if headers else None
        self.num_calls = self.num_failures = self.num_connects = 0
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: Any = None
        self._stop: asyncio.Event | None = None
        self._owner: Any = None  # the concurrent future of the task that holds the session open
        self.tools: list[str] = []

    # ------------------------------------------------------------------ connection
    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None or self._loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="mcp-client", daemon=True).start()
            self._loop = loop
        return self._loop

    def _transport(self):
        if self.url is not None:
            import httpx
            from mcp.client.streamable_http import streamable_http_client

            client = httpx.AsyncClient(headers=self.headers, timeout=httpx.Timeout(self.connect_timeout_s,
                                                                                  read=self.timeout_s))
            return client, streamable_http_client(self.url, http_client=client)
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        return None, stdio_client(StdioServerParameters(command=self.argv[0], args=self.argv[1:], env=self.env))

    async def _hold(self, ready: asyncio.Future, stop: asyncio.Event) -> None:
        """Open the transport and the session, report the tools, and keep them open until ``stop``."""
        from mcp import ClientSession

        client, transport = self._transport()
        try:
            async with transport as streams:
                async with ClientSession(streams[0], streams[1]) as session:
                    await session.initialize()
                    listed = await session.list_tools()
                    if not ready.done():
                        ready.set_result((session, [t.name for t in listed.tools]))
                    await stop.wait()
        except BaseException as exc:  # noqa: BLE001 - reported to whoever waits for the connection
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            if not isinstance(exc, Exception):
                raise
        finally:
            if client is not None:
                await client.aclose()

    def connect(self) -> list[str]:
        """Open the session (if it is not open) and return the server's tool names; :class:`MCPError` when the
        server does not answer within ``connect_timeout_s`` or lacks ``tool``."""
        with self._lock:
            if self._session is not None:
                return self.tools
            loop = self._ensure_loop()

            async def start():
                ready, stop = loop.create_future(), asyncio.Event()
                owner = asyncio.ensure_future(self._hold(ready, stop))
                try:
                    session, tools = await asyncio.wait_for(asyncio.shield(ready), self.connect_timeout_s)
                except BaseException:
                    stop.set()
                    owner.cancel()
                    raise
                return session, tools, stop, owner

            try:
                session, tools, stop, owner = asyncio.run_coroutine_threadsafe(start(), loop).result(
                    self.connect_timeout_s + 5.0)
            except Exception as exc:  # noqa: BLE001
                self.num_failures += 1
                raise MCPError("connect", f"cannot connect to the MCP server {self.server} (allowed "
                                          f"{self.connect_timeout_s:g}s): {_cause(exc)}") from None
            self.num_connects += 1
            self._session, self.tools, self._stop, self._owner = session, tools, stop, owner
            if self.tool not in tools:
                self._drop()
                raise MCPError("no_tool", f"the MCP server {self.server} has no tool {self.tool!r} (it has: "
                                          f"{', '.join(tools) or 'none'})")
            return tools

    def _drop(self) -> None:
        """Forget the session (stopping its task); the next call reconnects."""
        stop, loop, owner = self._stop, self._loop, self._owner
        self._session = self._stop = self._owner = None
        if stop is not None and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stop.set)
            if owner is not None:
                loop.call_soon_threadsafe(owner.cancel)

    # ------------------------------------------------------------------ calls
    def call_many(self, arguments: Sequence[Mapping[str, Any]]) -> list[Any]:
        """Each call's result payload (structured content, else parsed JSON text), run concurrently."""
        self.connect()
        session, loop = self._session, self._loop
        if session is None or loop is None:
            raise MCPError("connect", f"the MCP server {self.server} is not connected")

        async def one(args: Mapping[str, Any]):
            return await session.call_tool(self.tool, dict(args), read_timeout_seconds=_read_timeout(self.timeout_s))

        async def all_of():
            return await asyncio.wait_for(asyncio.gather(*(one(a) for a in arguments)), self.timeout_s)

        self.num_calls += len(arguments)
        try:
            results = asyncio.run_coroutine_threadsafe(all_of(), loop).result(self.timeout_s + 5.0)
        except Exception as exc:  # noqa: BLE001 - a dead server, a timeout, a protocol error
            self.num_failures += 1
            with self._lock:
                self._drop()
            kind = "timeout" if isinstance(exc, (TimeoutError, asyncio.TimeoutError)) else "call"
            raise MCPError(kind, f"MCP tool {self.tool!r} at {self.server} failed: {_cause(exc)}") from None
        return [self._payload(r) for r in results]

    def call(self, arguments: Mapping[str, Any]) -> Any:
        return self.call_many([arguments])[0]

    def _payload(self, result: Any) -> Any:
        texts = [c.text for c in result.content if getattr(c, "type", None) == "text"]
        # mcp 1.x names the fields as on the wire (isError, structuredContent); mcp 2.x in snake case
        is_error = result.is_error if hasattr(result, "is_error") else result.isError
        structured = result.structured_content if hasattr(result, "structured_content") else result.structuredContent
        if is_error:
            raise MCPError("tool_error", f"MCP tool {self.tool!r} at {self.server} returned an error: "
                                         f"{' '.join(texts)[:300]}")
        if structured is not None:
            return structured
        try:
            values = [json.loads(t) for t in texts]
        except ValueError:
            raise MCPError("bad_result", f"MCP tool {self.tool!r} at {self.server} returned text that is not JSON "
                                         f"and no structured content: {' '.join(texts)[:200]!r}") from None
        return values[0] if len(values) == 1 else values

    def close(self) -> None:
        with self._lock:
            self._drop()
        loop, self._loop = self._loop, None
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(loop.stop)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_lock=None, _loop=None, _session=None, _stop=None, _owner=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


def _cause(exc: BaseException) -> str:
    """The innermost readable reason (anyio wraps transport errors in exception groups)."""
    while getattr(exc, "exceptions", None):  # an ExceptionGroup (built in from Python 3.11, a backport before)
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]
