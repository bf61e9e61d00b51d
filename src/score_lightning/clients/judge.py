"""The client of an LLM judge (``evaluator.source=external``, the citation reward): many judgements at once
over one OpenAI-compatible endpoint, and an honest account of what failed.

Each judgement is :meth:`ChatClient.ask <score_lightning.clients.chat.ChatClient.ask>`: a chat call under the
process's limiter (its share of the run's ``judge.max_concurrency`` in flight and ``judge.requests_per_minute``,
at most ``judge.queue_timeout_s`` waiting for a slot), with a hard deadline of ``judge.timeout_s`` per call,
the SDK's transport retries and the re-asks of an unusable reply (``judge.max_retries`` each). Its result is a
value or an error kind (``timeout``, ``queue_timeout``, ``connection``,
``http_<status>``, ``bad_response``, ``truncated``, ``unparseable``, and ``invalid``: a reply that parsed but broke
one of the caller's rules, its reason kept), never a score: what a failed judgement means for a reward is the
caller's decision (the step leaves that report out of its group).

:class:`JudgeTally` counts a step's judgements (``judge/failed_rate``, ``judge/latency_s``,
``judge/in_flight_max``) and words the error when too many failed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
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


def _plain(value: Any) -> Any:
    """A config node's value as plain dicts and lists, as the HTTP client serialises it."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_plain(v) for v in value]
    return value


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
                               extra_body=_plain(settings.extra_body), limiter=limiter, deadline_s=timeout_s)

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


@dataclass
class JudgeTally:
    """A step's judgements: how many, how many failed and how, how long they took. Plain values, so it
    travels with an asynchronous batch and into a checkpoint."""

    endpoint: str = ""
    requests: int = 0
    failed: int = 0
    kinds: dict[str, int] = field(default_factory=dict)  # error kind -> failed judgements
    latency_sum: float = 0.0
    latency_max: float = 0.0
    in_flight_max: float = 0.0
    reasons: dict[str, int] = field(default_factory=dict)  # kind "invalid": the rule the last reply broke -> count

    def add(self, outcomes: Sequence[ChatOutcome]) -> None:
        for out in outcomes:
            self.requests += 1
            self.latency_sum += out.latency_s
            self.latency_max = max(self.latency_max, out.latency_s)
            if not out.ok:
                self.failed += 1
                self.kinds[str(out.error)] = self.kinds.get(str(out.error), 0) + 1
                if out.error == "invalid":
                    self.reasons[out.detail] = self.reasons.get(out.detail, 0) + 1

    def merge(self, other: "JudgeTally") -> "JudgeTally":
        out = JudgeTally(self.endpoint or other.endpoint, self.requests + other.requests, self.failed + other.failed,
                         dict(self.kinds), self.latency_sum + other.latency_sum,
                         max(self.latency_max, other.latency_max), max(self.in_flight_max, other.in_flight_max))
        out.reasons = dict(self.reasons)
        for k, n in other.kinds.items():
            out.kinds[k] = out.kinds.get(k, 0) + n
        for k, n in other.reasons.items():
            out.reasons[k] = out.reasons.get(k, 0) + n
        return out

    @property
    def failed_rate(self) -> float:
        return self.failed / self.requests if self.requests else 0.0

    def metrics(self) -> dict[str, float]:
        if not self.requests:
            return {}
        return {"judge/failed_rate": self.failed_rate, "judge/latency_s": self.latency_sum / self.requests,
                "judge/latency_max_s": self.latency_max, "judge/in_flight_max": float(self.in_flight_max),
                "judge/requests": float(self.requests)}

    def describe(self) -> str:
        """``3 of 8 judgements failed at <endpoint>: timeout x2, invalid x1 (invalid: report 1: missing ... x1)``."""
        kinds = ", ".join(f"{k} x{n}" for k, n in _by_count(self.kinds))
        reasons = "; ".join(f"{k} x{n}" for k, n in _by_count(self.reasons))
        return (f"{self.failed} of {self.requests} judgements failed at {self.endpoint}" + (f": {kinds}" if kinds else "")
                + (f" (invalid: {reasons})" if reasons else ""))


def _by_count(counts: dict[str, int]) -> list[tuple[str, int]]:
    """Most frequent first, then by name: the order an error message lists them in."""
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
