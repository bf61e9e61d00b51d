"""The client of the ``judge`` endpoint: many judgements at once over one OpenAI-compatible API.

Each judgement is :meth:`ChatClient.ask <score_lightning.clients.chat.ChatClient.ask>`: a chat call under the
process's limiter (its share of the run's ``judge.max_concurrency`` in flight and ``judge.requests_per_minute``,
at most ``judge.queue_timeout_s`` waiting for a slot), with a hard deadline of ``judge.timeout_s`` per call,
the SDK's transport retries and the re-asks of an unusable reply (``judge.max_retries`` each). Its result is a
value or an error kind (:mod:`score_lightning.clients.judge`), never a score: what a failed judgement means for a
reward is the caller's decision (the step leaves that report out of its group).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from score_lightning.clients.chat import ChatClient, ChatOutcome
from score_lightning.clients.limiter import Limiter


class JudgeSettings(Protocol):
    """What the client reads of the ``judge`` config group. The run passes its ``judge`` node itself (typed by the
    config schema's ``JudgeConfig``, which this package, below every layer that calls it, does not import), so
    each value and its default live in ``configs/judge/default.yaml`` only. The limits (``max_concurrency``,
    ``requests_per_minute``, ``queue_timeout_s``) are the process's limiter's, configured by the caller."""

    base_url: str
    model: str
    api_key_env: str | None  # the variable holding the key (unset: a placeholder key)
    timeout_s: float  # each call's hard deadline (and each HTTP request's timeout)
    max_retries: int  # SDK transport retries, and re-asks of an unusable reply
    temperature: float
    max_tokens: int | None
    extra_body: Mapping[str, Any] | None  # e.g. vLLM's structured-output options


#: (messages, parse: raises ValueError if unusable) or (messages, parse, what a re-ask asks for)
Request = tuple[list[dict[str, str]], Callable[[str], Any]] | tuple[list[dict[str, str]], Callable[[str], Any], str]


class LLMJudge:
    """One judge endpoint. ``judge`` runs a batch of requests concurrently; the process's limiter (configured
    with this process's share of the run's limits before the first call) bounds them together with every
    other chat call."""

    def __init__(self, settings: JudgeSettings, limiter: Limiter | None = None) -> None:
        self.settings = settings
        key = os.environ.get(settings.api_key_env) if settings.api_key_env else None
        timeout_s, max_tokens = float(settings.timeout_s), settings.max_tokens
        self.chat = ChatClient(str(settings.base_url), str(settings.model), key, timeout_s=timeout_s,
                               max_retries=int(settings.max_retries), temperature=float(settings.temperature),
                               max_tokens=None if max_tokens is None else int(max_tokens),
                               extra_body=settings.extra_body, limiter=limiter, deadline_s=timeout_s)

    @property
    def endpoint(self) -> str:
        """How error messages name the judge: its URL and model."""
        return f"{str(self.settings.base_url).rstrip('/')}/chat/completions (model {self.settings.model})"

    @property
    def limiter(self) -> Limiter:
        return self.chat.limiter

    def judge(self, requests: Sequence[Request]) -> list[ChatOutcome]:
        """Every request's outcome, in order (never raises for a backend failure)."""
        if not requests:
            return []
        workers = max(1, min(len(requests), self.limiter.max_concurrency))  # this process's share
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="judge") as pool:
            return list(pool.map(lambda r: self.chat.ask(*r), requests))

    def close(self) -> None:
        self.chat.close()
