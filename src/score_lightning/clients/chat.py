"""One OpenAI-compatible chat client for every external LLM call: the meta-harness, the rubric writer, the
appraisal, the LLM judges (official SDK).

Two kinds of retry, kept apart on purpose:

* **transport** (the ``openai`` SDK): connection errors, timeouts, HTTP 408/409/429/5xx are retried
  ``max_retries`` times with exponential backoff and jitter (``Retry-After`` honoured); other 4xx
  are not retried, they will not fix themselves;
* **semantic** (:meth:`ChatClient.ask`): the server answered, but the reply is unusable (does not
  parse, violates the schema, was cut at ``max_tokens``, or is not a chat completion). The model is
  shown its reply and the reason, and asked again, ``max_retries`` times; that fixes most slips.

**Limits.** Every call goes through a :class:`~score_lightning.clients.limiter.Limiter` (the process's
shared one unless the client is given its own): a slot while it is in flight, a requests-per-minute token per
HTTP request. A call waits at most the limiter's ``queue_timeout_s`` for its slot and first token, else it
fails as ``queue_timeout`` (nothing was sent). ``timeout_s`` bounds each HTTP request whole, from sending it
to the last byte of its reply (a server that trickles its body byte by byte is cut there, as a timeout the SDK
may retry); ``deadline_s`` (the LLM judge sets it to its ``judge.timeout_s``) is a call's hard deadline:
whatever the server does (hangs, trickles bytes, asks for a long ``Retry-After``), :meth:`ChatClient.complete`
returns or fails within ``deadline_s`` of its first request being sent, and no SDK retry starts after it.
The slot is held until the call's thread has ended its request, so the limiter's count stays what the server
sees: a body still arriving at the deadline is dropped at its next chunk, and every read waits at most the time
left when its request was sent. Without ``deadline_s`` a call ends when the SDK's attempts (each bounded by
``timeout_s``) do.

A request that still fails is reported as a :class:`ChatOutcome` with an error *kind*, never
raised: the callers (a training run, an evaluation over hundreds of articles) must go on.
"""

from __future__ import annotations

import importlib
import json
import logging
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import openai

from score_lightning.clients.limiter import Limiter, shared_limiter

log = logging.getLogger(__name__)

#: Sent when no API key is configured: the SDK refuses ``api_key=None``, and local servers
#: (vLLM, SGLang, llama.cpp) do not check the key. vLLM's own docs use this value.
PLACEHOLDER_API_KEY = "EMPTY"

T = TypeVar("T")

#: the HTTP library the ``openai`` SDK is built on (``httpx``; ``httpx2`` in newer SDKs): the reply-body wrapper
#: below must be its stream type, and a timeout its exception, for the SDK to close and retry as usual
_HTTP = importlib.import_module(
    next(c for c in openai.DefaultHttpxClient.__mro__[1:] if c.__name__ == "Client").__module__.partition(".")[0])


class ReplyError(ValueError):
    """The model answered, but not in the expected form: worth asking again with the reason.

    ``kind`` is the failure kind the reply counts as when every re-ask fails (``unparseable``: no usable
    form; a caller's own kind, e.g. the judge's ``invalid``, for a reply that parsed but broke a rule)."""

    def __init__(self, message: str, kind: str = "unparseable") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class ChatOutcome:
    """A request's result: ``value`` on success, else ``error`` (the last failure's kind) and ``detail``.

    ``attempts`` counts HTTP requests, transport retries included; ``latency_s`` is the time its calls spent
    from their first request to their reply (or deadline), not the wait for a slot.
    """

    value: Any = None
    error: str | None = None
    detail: str = ""
    attempts: int = 0
    latency_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


class _Failure(Exception):
    """Internal: one chat call failed; ``semantic`` failures are re-asked, the others are final."""

    def __init__(self, kind: str, detail: str, *, semantic: bool, content: str | None = None) -> None:
        super().__init__(detail)
        self.kind, self.detail, self.semantic, self.content = kind, detail, semantic, content


class _Cancelled(BaseException):
    """Raised in the request hook once a call's deadline has passed: no further SDK retry is sent. A
    ``BaseException``, so that no version of the SDK takes it for a transport error worth retrying."""


class _Call:
    """One chat call in flight: its deadline, whether its caller gave up, the HTTP requests it sent."""

    def __init__(self) -> None:
        self.deadline = float("inf")
        self.request_end = float("inf")  # the request in flight: min(its send + timeout_s, the deadline)
        self.cancelled = False
        self.requests = 0
        self.admitted = False  # the first request's rate token was taken before the clock started

    def over(self) -> bool:
        return self.cancelled or time.monotonic() >= self.deadline


class _BoundedBody(_HTTP.SyncByteStream):  # type: ignore[name-defined,misc]
    """A reply body that ends at its request's end: a server trickling bytes cannot hold the call (and its
    slot) past it. Past the call's deadline it stops the call (no retry); past ``timeout_s`` it is a timeout."""

    def __init__(self, stream: Any, call: _Call) -> None:
        self._stream, self._call = stream, call

    def __iter__(self) -> Any:
        for chunk in self._stream:
            if self._call.over():
                raise _Cancelled()
            if time.monotonic() >= self._call.request_end:
                raise _HTTP.ReadTimeout("the reply's body did not end within timeout_s of the request")
            yield chunk

    def close(self) -> None:
        self._stream.close()


class ChatClient:
    """``client.chat.completions.create`` with error kinds, a request counter and semantic retries.

    Thread-safe: the judge shares one client between worker threads (httpx clients are).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        timeout_s: float = 60.0,
        max_retries: int = 2,
        temperature: float = 0.0,
        max_tokens: int | None = 1024,
        extra_body: Mapping[str, Any] | None = None,
        limiter: Limiter | None = None,
        deadline_s: float | None = None,
    ) -> None:
        if max_retries < 0 or timeout_s <= 0:
            raise ValueError(f"need max_retries >= 0 and timeout_s > 0, got {max_retries} and {timeout_s}")
        if deadline_s is not None and deadline_s <= 0:
            raise ValueError(f"deadline_s must be > 0 (or None: no call deadline), got {deadline_s}")
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + "/chat/completions"  # for error messages; the SDK builds the requests
        self.model = model
        self.api_key = api_key or None
        self.timeout_s = float(timeout_s)
        self.deadline_s = None if deadline_s is None else float(deadline_s)
        self.max_retries = int(max_retries)
        self.temperature = float(temperature)
        self.max_tokens = int(max_tokens) if max_tokens else None
        self.extra_body: dict[str, Any] = _plain(extra_body or {})  # Hydra's DictConfig is not JSON
        self.num_requests = 0  # HTTP requests, transport retries included
        self._lock = threading.Lock()
        self._local = threading.local()  # per caller thread: the requests of its ask(); per call thread: the _Call
        self._client: openai.OpenAI | None = None
        self._own_limiter = limiter  # None: the process's shared limiter (looked up again after unpickling)

    @property
    def limiter(self) -> Limiter:
        return self._own_limiter if self._own_limiter is not None else shared_limiter()

    # ------------------------------------------------------------------ SDK client
    @property
    def client(self) -> openai.OpenAI:
        """The SDK client, built on first use; pickling drops it (sockets) and the copy rebuilds it."""
        with self._lock:
            if self._client is None:
                self._client = openai.OpenAI(
                    base_url=self.base_url, api_key=self.api_key or PLACEHOLDER_API_KEY,
                    timeout=self.timeout_s, max_retries=self.max_retries,
                    http_client=openai.DefaultHttpxClient(event_hooks={"request": [self._count_request],
                                                                       "response": [self._bound_body]}),
                )
            return self._client

    def _count_request(self, request: Any) -> None:
        """httpx event hook: runs once per HTTP request (each SDK retry too), in the call's thread. It takes the
        request's rate token, stops the SDK from retrying past the call's deadline, and caps every timeout of
        the request (connect, write, each read) at the time it has left."""
        call: _Call | None = getattr(self._local, "call", None)
        if call is not None:
            if call.admitted:
                call.admitted = False
            elif call.cancelled or not self.limiter.admit(deadline=call.deadline):
                raise _Cancelled()
            if call.over():
                raise _Cancelled()
            now = time.monotonic()
            call.request_end = min(now + self.timeout_s, call.deadline)
            left = call.request_end - now
            timeouts = {"connect": None, "read": None, "write": None, "pool": None,
                        **(request.extensions.get("timeout") or {})}
            request.extensions["timeout"] = {k: left if v is None else min(float(v), left) for k, v in timeouts.items()}
            call.requests += 1
        with self._lock:
            self.num_requests += 1

    def _bound_body(self, response: Any) -> None:
        """httpx event hook, once the reply's headers are in: its body must end by the request's end."""
        call: _Call | None = getattr(self._local, "call", None)
        if call is not None:
            response.stream = _BoundedBody(response.stream, call)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_client=None, _lock=None, _local=None)  # a shared limiter is the unpickling process's own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock, self._local = threading.Lock(), threading.local()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # ------------------------------------------------------------------ one call
    def complete(self, messages: list[dict[str, str]]) -> str:
        """The reply text of one chat completion; raises :class:`_Failure` with the error kind."""
        kwargs: dict[str, Any] = {"model": self.model, "messages": messages, "temperature": self.temperature}
        if self.max_tokens is not None:
            kwargs["max_tokens"] = self.max_tokens
        if self.extra_body:
            kwargs["extra_body"] = self.extra_body
        try:
            completion = self._create(kwargs)
        except openai.APITimeoutError:
            raise _Failure("timeout", f"timeout: no reply from {self.url} within {self.timeout_s:g}s",
                           semantic=False) from None
        except openai.APIConnectionError as exc:
            cause = exc.__cause__ or exc
            raise _Failure("connection", f"connection error to {self.url}: {cause}", semantic=False) from None
        except openai.APIStatusError as exc:
            raise _Failure(f"http_{exc.status_code}", f"HTTP {exc.status_code} from {self.url}: {str(exc)[:200]}",
                           semantic=False) from None
        except (openai.OpenAIError, ValueError) as exc:  # ValueError: a body that is not JSON
            raise _Failure("bad_response", f"malformed response from {self.url}: {str(exc)[:200]}",
                           semantic=True) from None
        try:
            choice = completion.choices[0]
            content, finish = choice.message.content, choice.finish_reason
        except (AttributeError, IndexError, TypeError):
            raise _Failure("bad_response", "malformed response (missing choices[0].message.content)",
                           semantic=True) from None
        if not isinstance(content, str) or not content.strip():
            raise _Failure("bad_response", "malformed response: choices[0].message.content is empty",
                           semantic=True)
        if finish == "length":
            raise _Failure("truncated", f"reply truncated at max_tokens ({self.max_tokens})", semantic=True,
                           content=content)
        return content

    def _create(self, kwargs: dict[str, Any]) -> Any:
        """``chat.completions.create`` in a thread of its own, holding a limiter slot, within the deadline.

        The clock starts when the slot is held and the first request is admitted (a wait for a slot or a rate
        token is the process's queue, not the server's latency); that wait ends at the limiter's
        ``queue_timeout_s`` as a ``queue_timeout``. At the deadline the caller gets a timeout; the thread ends
        when the request in flight does (bounded by the deadline, see :class:`_BoundedBody`), sends no retry,
        and gives the slot back.
        """
        call, done, box = _Call(), threading.Event(), {}
        client, limiter = self.client, self.limiter
        queue_end = time.monotonic() + limiter.queue_timeout_s
        if not limiter.acquire(deadline=queue_end):
            raise _Failure("queue_timeout", f"queue timeout: no free slot of {limiter.max_concurrency} for a call "
                                            f"to {self.url} within {limiter.queue_timeout_s:g}s", semantic=False)
        if not limiter.admit(deadline=queue_end):
            limiter.release()
            raise _Failure("queue_timeout", f"queue timeout: no request to {self.url} allowed by "
                                            f"requests_per_minute={limiter.requests_per_minute} within "
                                            f"{limiter.queue_timeout_s:g}s", semantic=False)
        call.admitted = True
        if self.deadline_s is not None:
            call.deadline = time.monotonic() + self.deadline_s

        def run() -> None:
            self._local.call = call
            try:
                box["value"] = client.chat.completions.create(**kwargs)
            except _Cancelled:
                pass
            except BaseException as exc:  # re-raised in the caller's thread
                box["error"] = exc
            finally:
                limiter.release()
                done.set()

        threading.Thread(target=run, name="chat-call", daemon=True).start()
        t0 = time.monotonic()
        finished = done.wait(timeout=None if self.deadline_s is None else max(call.deadline - t0, 0.0))
        self._local.latency = getattr(self._local, "latency", 0.0) + (time.monotonic() - t0)
        if not finished:
            call.cancelled = True
        self._local.requests = getattr(self._local, "requests", 0) + call.requests
        if not finished or "value" not in box and "error" not in box:
            raise _Failure("timeout", f"timeout: no reply from {self.url} within {self.deadline_s:g}s "
                                      f"(the call's deadline)", semantic=False)
        if "error" in box:
            raise box["error"]
        return box["value"]

    # ------------------------------------------------------------------ semantic retries
    def ask(self, messages: list[dict[str, str]], parse: Callable[[str], T],
            expect: str = "one corrected JSON object") -> ChatOutcome:
        """Send, parse; an unusable reply is re-asked up to ``max_retries`` times with the reason.

        ``parse`` raises ``ValueError`` (e.g. :class:`ReplyError`) for an invalid reply; the re-ask asks for
        ``expect`` ("Reply again with <expect> only"). Never raises
        for backend failures: they come back as ``ChatOutcome.error`` (``timeout``, ``queue_timeout``, ``connection``,
        ``http_<status>``, ``bad_response``, ``truncated``, ``unparseable``, or a :class:`ReplyError`'s ``kind``).
        """
        out = ChatOutcome()
        self._local.requests, self._local.latency = 0, 0.0
        try:
            for _ in range(self.max_retries + 1):
                try:
                    content = self.complete(messages)
                except _Failure as exc:
                    out.error, out.detail = exc.kind, exc.detail
                    if not exc.semantic:
                        break  # the SDK already retried what transport retries can fix
                    messages = _corrected(messages, exc.content, exc.detail, expect)
                    continue
                try:
                    out.value, out.error, out.detail = parse(content), None, ""
                    return out
                except (ValueError, TypeError, KeyError) as exc:  # HarnessStateError, ReplyError are ValueErrors
                    out.error, out.detail = getattr(exc, "kind", "unparseable"), str(exc)
                    messages = _corrected(messages, content, str(exc), expect)
                log.debug("chat request to %s: %s %s", self.url, out.error, out.detail[:120])
            return out
        finally:
            out.attempts, out.latency_s = self._local.requests, self._local.latency


def _corrected(messages: list[dict[str, str]], reply: str | None, reason: str,
               expect: str = "one corrected JSON object") -> list[dict[str, str]]:
    """The conversation plus the rejected reply and why, so the next answer can fix it."""
    extra = [{"role": "assistant", "content": reply}] if reply else []
    note = (f"That reply was rejected ({reason}). Reply again with {expect} only"
            + (", shorter." if "truncated" in reason else "."))
    return [*messages, *extra, {"role": "user", "content": note}]


def _plain(value: Any) -> Any:
    """Nested mappings and sequences as plain dicts and lists (Hydra's ``DictConfig`` is not JSON)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_plain(v) for v in value]
    return value


_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


def extract_json_object(text: str) -> dict[str, Any]:
    """The first JSON object in ``text``; tolerates ```json fences, prose and ``<think>`` blocks."""
    text = _THINK.sub("", text or "")
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            obj, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            return obj
    raise ReplyError(f"no JSON object in reply: {text[:200]!r}")
