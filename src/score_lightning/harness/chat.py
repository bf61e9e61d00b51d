"""One OpenAI-compatible chat client for the LLM meta-harness and the LLM judge (official SDK).

Two kinds of retry, kept apart on purpose:

* **transport** (the ``openai`` SDK): connection errors, timeouts, HTTP 408/409/429/5xx are retried
  ``max_retries`` times with exponential backoff and jitter (``Retry-After`` honoured); other 4xx
  are not retried, they will not fix themselves;
* **semantic** (:meth:`ChatClient.ask`): the server answered, but the reply is unusable (does not
  parse, violates the schema, was cut at ``max_tokens``, or is not a chat completion). The model is
  shown its reply and the reason, and asked again, ``max_retries`` times; that fixes most slips.

A request that still fails is reported as a :class:`ChatOutcome` with an error *kind*, never
raised: the callers (a training run, an evaluation over hundreds of articles) must go on.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping, TypeVar

import openai

from score_lightning.harness.state import to_plain

log = logging.getLogger(__name__)

#: Sent when no API key is configured: the SDK refuses ``api_key=None``, and local servers
#: (vLLM, SGLang, llama.cpp) do not check the key. vLLM's own docs use this value.
PLACEHOLDER_API_KEY = "EMPTY"

T = TypeVar("T")


class ReplyError(ValueError):
    """The model answered, but not in the expected form: worth asking again with the reason."""


@dataclass
class ChatOutcome:
    """A request's result: ``value`` on success, else ``error`` (the last failure's kind) and ``detail``.

    ``attempts`` counts HTTP requests, transport retries included.
    """

    value: Any = None
    error: str | None = None
    detail: str = ""
    attempts: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None


class _Failure(Exception):
    """Internal: one chat call failed; ``semantic`` failures are re-asked, the others are final."""

    def __init__(self, kind: str, detail: str, *, semantic: bool, content: str | None = None) -> None:
        super().__init__(detail)
        self.kind, self.detail, self.semantic, self.content = kind, detail, semantic, content


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
    ) -> None:
        if max_retries < 0 or timeout_s <= 0:
            raise ValueError(f"need max_retries >= 0 and timeout_s > 0, got {max_retries} and {timeout_s}")
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + "/chat/completions"  # for error messages; the SDK builds the requests
        self.model = model
        self.api_key = api_key or None
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.temperature = float(temperature)
        self.max_tokens = int(max_tokens) if max_tokens else None
        self.extra_body: dict[str, Any] = to_plain(extra_body or {})  # Hydra's DictConfig is not JSON
        self.num_requests = 0  # HTTP requests, transport retries included
        self._lock = threading.Lock()
        self._local = threading.local()  # per-thread request count of the call in progress
        self._client: openai.OpenAI | None = None

    # ------------------------------------------------------------------ SDK client
    @property
    def client(self) -> openai.OpenAI:
        """The SDK client, built on first use; pickling drops it (sockets) and the copy rebuilds it."""
        with self._lock:
            if self._client is None:
                self._client = openai.OpenAI(
                    base_url=self.base_url, api_key=self.api_key or PLACEHOLDER_API_KEY,
                    timeout=self.timeout_s, max_retries=self.max_retries,
                    http_client=openai.DefaultHttpxClient(event_hooks={"request": [self._count_request]}),
                )
            return self._client

    def _count_request(self, request: Any) -> None:
        """httpx event hook: runs once per HTTP request (each SDK retry too), in the calling thread."""
        with self._lock:
            self.num_requests += 1
        self._local.requests = getattr(self._local, "requests", 0) + 1

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_client=None, _lock=None, _local=None)
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
            completion = self.client.chat.completions.create(**kwargs)
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

    # ------------------------------------------------------------------ semantic retries
    def ask(self, messages: list[dict[str, str]], parse: Callable[[str], T],
            expect: str = "one corrected JSON object") -> ChatOutcome:
        """Send, parse; an unusable reply is re-asked up to ``max_retries`` times with the reason.

        ``parse`` raises ``ValueError`` (e.g. :class:`ReplyError`) for an invalid reply; the re-ask asks for
        ``expect`` ("Reply again with <expect> only"). Never raises
        for backend failures: they come back as ``ChatOutcome.error`` (``timeout``, ``connection``,
        ``http_<status>``, ``bad_response``, ``truncated``, ``unparseable``).
        """
        out = ChatOutcome()
        self._local.requests = 0
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
                    out.error, out.detail = "unparseable", str(exc)
                    messages = _corrected(messages, content, str(exc), expect)
                log.debug("chat request to %s: %s %s", self.url, out.error, out.detail[:120])
            return out
        finally:
            out.attempts = self._local.requests


def _corrected(messages: list[dict[str, str]], reply: str | None, reason: str,
               expect: str = "one corrected JSON object") -> list[dict[str, str]]:
    """The conversation plus the rejected reply and why, so the next answer can fix it."""
    extra = [{"role": "assistant", "content": reply}] if reply else []
    note = (f"That reply was rejected ({reason}). Reply again with {expect} only"
            + (", shorter." if "truncated" in reason else "."))
    return [*messages, *extra, {"role": "user", "content": note}]


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
