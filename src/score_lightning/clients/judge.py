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
from typing import Any

from score_lightning.clients.chat import ChatClient, ChatOutcome
from score_lightning.clients.limiter import Limiter


@dataclass(frozen=True)
class JudgeSettings:
    """The ``judge`` config group."""

    base_url: str
    model: str
    api_key_env: str | None = "OPENAI_API_KEY"  # the variable holding the key (unset: a placeholder key)
    max_concurrency: int = 8  # calls in flight for the whole run (each process configures its share of it)
    requests_per_minute: int = 0  # 0: unlimited; the whole run's, like max_concurrency
    timeout_s: float = 60.0  # each call's hard deadline (and each HTTP request's timeout)
    max_retries: int = 2  # SDK transport retries, and re-asks of an unusable reply
    max_failed_rate: float = 0.5  # a step whose failed share exceeds this stops the run
    temperature: float = 0.0
    max_tokens: int | None = 1024
    extra_body: Mapping[str, Any] | None = None  # e.g. vLLM's structured-output options

    @classmethod
    def from_cfg(cls, node: Mapping[str, Any]) -> "JudgeSettings":
        known = set(cls.__dataclass_fields__)
        return cls(**{k: (dict(v) if isinstance(v, Mapping) else v) for k, v in node.items() if k in known})

    @property
    def endpoint(self) -> str:
        """How error messages name the judge: its URL and model."""
        return f"{self.base_url.rstrip('/')}/chat/completions (model {self.model})"


#: (messages, parse: raises ValueError if unusable) or (messages, parse, what a re-ask asks for)
Request = tuple[list[dict[str, str]], Callable[[str], Any]] | tuple[list[dict[str, str]], Callable[[str], Any], str]


class LLMJudge:
    """One judge endpoint. ``judge`` runs a batch of requests concurrently; the process's limiter (configured
    with this process's share of the run's limits before the first call) bounds them together with every
    other chat call."""

    def __init__(self, settings: JudgeSettings, limiter: Limiter | None = None) -> None:
        self.settings = settings
        key = os.environ.get(settings.api_key_env) if settings.api_key_env else None
        self.chat = ChatClient(settings.base_url, settings.model, key, timeout_s=settings.timeout_s,
                               max_retries=settings.max_retries, temperature=settings.temperature,
                               max_tokens=settings.max_tokens, extra_body=settings.extra_body, limiter=limiter,
                               deadline_s=settings.timeout_s)

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
