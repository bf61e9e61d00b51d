"""The account of a step's external judgements (``judge/*``): how many, how many failed and how, how long they took.

Whatever sends them (the external judge plug-in, ``methods/judge/``, through :class:`~score_lightning.clients.chat.
ChatClient`), each judgement is a value or an error kind (``timeout``, ``queue_timeout``, ``connection``,
``http_<status>``, ``bad_response``, ``truncated``, ``unparseable``, and ``invalid``: a reply that parsed but broke
one of the caller's rules, its reason kept), never a score. :class:`JudgeTally` counts them
(``judge/failed_rate``, ``judge/latency_s``, ``judge/in_flight_max``) and words the error when too many failed
(``step/faults.check_judgements``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from score_lightning.clients.chat import ChatOutcome


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
