"""A synchronous client of one MCP tool server, on the official ``mcp`` SDK (streamable HTTP or stdio).

DR Tulu's agent library serves its search, browse and paper tools over MCP, and open-instruct has a generic
MCP tool; this client lets the trainer call such a tool the way it calls every other retriever: a blocking
``call_many(arguments)`` per batch of queries, from whichever thread runs the agent loop.

* **Transport**: ``url`` (streamable HTTP, e.g. ``http://127.0.0.1:8002/mcp``) or ``command`` (stdio: the
  server's command line, started as a child process and ended by :meth:`MCPToolClient.close`).
* **One session**: the SDK is asynchronous; the client runs an event loop in a daemon thread and keeps one
  session open in a task of its own (an MCP session's streams must be opened and closed by the same task).
  Tool calls are submitted to that loop; a batch of queries runs concurrently.
* **Faults, per call**: connecting (initialize, then ``tools/list`` to check that ``tool`` exists) is bounded by
  ``connect_timeout_s``. Each call has its own deadline: it fails when the server has answered none of the
  batch's calls for ``timeout_s`` (a server that answers one call at a time is waited for while it keeps
  answering; a call it never answers fails alone). A failed call fails its own query only: ``call_many``
  returns, per call, its payload or the :class:`MCPError` it failed with. A session that broke (a transport
  error, or every call of a batch timed out) is dropped; the next call reconnects, so a server that comes back
  is used again. Kinds: ``connect``, ``no_tool`` (raised: no call could be made), ``timeout``, ``call``,
  ``tool_error``, ``bad_result`` (returned per call).
* **Results as servers send them** (:func:`payload_of`): structured content as is, except the SDK's wrapper of
  a tool that returns a string, ``{"result": "<text>"}``, which is read as that text; text content, each block
  parsed as JSON when it is a JSON object or list and kept as text otherwise. Mapping that onto documents is
  the retriever's (``retrieval/mcp.py``).
"""

from __future__ import annotations

import asyncio
import json
import shlex
import threading
from collections.abc import Mapping, Sequence
from typing import Any


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


def json_or_text(text: str) -> Any:
    """A text block's value: the JSON object or list it holds, else the text itself (prose, or a JSON scalar
    such as a bare number, which is no result list either)."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, (dict, list)) else text


def payload_of(structured: Any, texts: Sequence[str]) -> Any:
    """A successful tool result's payload, read in the shapes servers send (see the module docstring).

    The SDK (``MCPServer`` in 2.x, ``FastMCP`` in 1.x) sends a tool that returns a ``str`` as the structured
    content ``{"result": "<the string>"}``: that string is what the tool meant, JSON or prose.
    """
    if structured is not None:
        wrapped = structured.get("result") if isinstance(structured, Mapping) and len(structured) == 1 else None
        if isinstance(wrapped, str):
            return json_or_text(wrapped)
        return structured
    values = [json_or_text(t) for t in texts]
    return values[0] if len(values) == 1 else values


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
        self._owner: Any = None  # the task that holds the session open
        self._owners: list[Any] = []  # every such task not yet finished: close() waits for them (stdio: the child)
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

            # no read timeout of httpx's own: each call's deadline is call_many's (a queued call is not cut short)
            client = httpx.AsyncClient(headers=self.headers, timeout=httpx.Timeout(self.connect_timeout_s, read=None))
            return client, streamable_http_client(self.url, http_client=client)
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        return None, stdio_client(StdioServerParameters(command=self.argv[0], args=self.argv[1:], env=self.env))

    async def _hold(self, ready: asyncio.Future, stop: asyncio.Event) -> None:
        """Open the transport and the session, report the tools, and keep them open until ``stop``; leaving
        the transport's context ends a stdio server."""
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
                self._owners.append(owner)
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
        """Forget the session: its task leaves the transport (ending a stdio server) on its own; the next call
        reconnects."""
        stop, loop = self._stop, self._loop
        self._session = self._stop = self._owner = None
        if stop is not None and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stop.set)

    # ------------------------------------------------------------------ calls
    def call_many(self, arguments: Sequence[Mapping[str, Any]]) -> list[Any]:
        """Per call, in order: its payload (:func:`payload_of`) or the :class:`MCPError` it failed with. Raises
        :class:`MCPError` only when no call could be made (``connect``, ``no_tool``)."""
        self.connect()
        session, loop = self._session, self._loop
        if session is None or loop is None:
            raise MCPError("connect", f"the MCP server {self.server} is not connected")

        async def batch() -> list[Any]:
            tasks = [asyncio.ensure_future(session.call_tool(self.tool, dict(a))) for a in arguments]
            pending, heard = set(tasks), loop.time()
            while pending:  # each call's deadline: timeout_s after the later of its sending and the last answer
                done, pending = await asyncio.wait(pending, timeout=max(0.0, heard + self.timeout_s - loop.time()),
                                                   return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    break
                heard = loop.time()
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
            return [self._outcome(t) for t in tasks]

        self.num_calls += len(arguments)
        try:
            outcomes = asyncio.run_coroutine_threadsafe(batch(), loop).result(
                self.timeout_s * (len(arguments) + 1) + 5.0)
        except Exception as exc:  # noqa: BLE001 - the loop itself is stuck: every call of the batch failed
            outcomes = [MCPError("call", f"MCP tool {self.tool!r} at {self.server} failed: {_cause(exc)}")
                        for _ in arguments]
        failed = [o for o in outcomes if isinstance(o, MCPError)]
        self.num_failures += len(failed)
        timed_out = [o for o in failed if o.kind == "timeout"]
        if any(o.kind == "call" for o in failed) or (timed_out and len(timed_out) == len(outcomes)):
            with self._lock:  # the session broke (or the server stopped answering): reconnect next time
                self._drop()
        return outcomes

    def _outcome(self, task: asyncio.Future) -> Any:
        """One call's payload, or the :class:`MCPError` it failed with."""
        if task.cancelled() or not task.done():
            return MCPError("timeout", f"MCP tool {self.tool!r} at {self.server} did not answer this call within "
                                       f"{self.timeout_s:g}s of its last answer (retriever.timeout_s)")
        if task.exception() is not None:  # a dead server, a protocol error
            return MCPError("call", f"MCP tool {self.tool!r} at {self.server} failed: {_cause(task.exception())}")
        try:
            return self._payload(task.result())
        except MCPError as exc:
            return exc

    def call(self, arguments: Mapping[str, Any]) -> Any:
        """One call's payload; raises its :class:`MCPError`."""
        outcome = self.call_many([arguments])[0]
        if isinstance(outcome, MCPError):
            raise outcome
        return outcome

    def _payload(self, result: Any) -> Any:
        blocks = list(result.content or [])
        texts = [c.text for c in blocks if getattr(c, "type", None) == "text"]
        # mcp 1.x names the fields as on the wire (isError, structuredContent); mcp 2.x in snake case
        is_error = result.is_error if hasattr(result, "is_error") else result.isError
        structured = result.structured_content if hasattr(result, "structured_content") else result.structuredContent
        if is_error:
            raise MCPError("tool_error", f"MCP tool {self.tool!r} at {self.server} returned an error: "
                                         f"{' '.join(texts)[:300]}")
        if structured is None and not texts and blocks:
            kinds = sorted({str(getattr(c, "type", type(c).__name__)) for c in blocks})
            raise MCPError("bad_result", f"MCP tool {self.tool!r} at {self.server} returned no text and no "
                                         f"structured content, only content blocks of type {', '.join(kinds)}")
        return payload_of(structured, texts)

    def close(self) -> None:
        """End the session and wait (bounded) until its transport is closed: a stdio server started here is
        gone when this returns, not when the trainer's process exits."""
        with self._lock:
            self._drop()
            loop, self._loop = self._loop, None
            owners, self._owners = [o for o in self._owners if not o.done()], []
        if loop is None or loop.is_closed():
            return

        async def wind_down() -> None:
            if owners:
                _, late = await asyncio.wait(owners, timeout=self.connect_timeout_s + 5.0)
                for o in late:  # a transport that would not close: cancelled (the SDK still kills its child)
                    o.cancel()
                if late:
                    await asyncio.wait(late, timeout=5.0)

        try:
            asyncio.run_coroutine_threadsafe(wind_down(), loop).result(self.connect_timeout_s + 15.0)
        except Exception:  # noqa: BLE001 - closing is best effort; the loop stops regardless
            pass
        loop.call_soon_threadsafe(loop.stop)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_lock=None, _loop=None, _session=None, _stop=None, _owner=None, _owners=[])
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
