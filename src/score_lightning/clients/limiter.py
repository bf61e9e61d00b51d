"""One process-wide limit on the requests a run sends to external LLM endpoints.

Peers' users report judges that hung a whole run (verl PR #6673) or fanned out without bound (NeMo-Gym
#3023); verl's rate-limited reward manager (PR #4107) bounds concurrency and requests per minute. Here every
chat call of the process (the LLM judge, the meta-harness, the rubric writer, the rubric appraisal,
``evaluate.py judge``) goes through one :class:`Limiter`:

* **in flight**: at most ``max_concurrency`` calls hold a slot at once, whichever client or thread makes
  them. A call holds its slot from its first HTTP request until its last one has ended (the SDK's retries
  run one after another inside it), also when its caller stopped waiting at the deadline, so the server
  never sees more than ``max_concurrency`` requests from this process;
* **requests per minute** (``requests_per_minute``, 0 = unlimited): every HTTP request, each SDK retry
  included, waits until it is at most the N-th sent in the last 60 s (a sliding window).

``in_flight_max`` is the most calls in flight at once since :meth:`Limiter.window` was last read (the step
logs it as ``judge/in_flight_max``). The per-call deadline is the client's (``clients/chat.py``).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

WINDOW_S = 60.0  # the requests-per-minute window


class Limiter:
    """Slots for calls in flight and a sliding one-minute window for requests; thread-safe."""

    def __init__(self, max_concurrency: int = 8, requests_per_minute: int = 0) -> None:
        self._cond = threading.Condition()
        self.in_flight = 0
        self.in_flight_max = 0  # since the last window()
        self.requests = 0  # HTTP requests let through, all time
        self._sent: collections.deque[float] = collections.deque()
        self.configure(max_concurrency, requests_per_minute)

    def configure(self, max_concurrency: int, requests_per_minute: int = 0) -> "Limiter":
        """Set both limits (callers waiting for a slot see a raised one at once)."""
        if int(max_concurrency) < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if int(requests_per_minute) < 0:
            raise ValueError(f"requests_per_minute must be >= 0 (0: unlimited), got {requests_per_minute}")
        with self._cond:
            self.max_concurrency = int(max_concurrency)
            self.requests_per_minute = int(requests_per_minute)
            self.in_flight_max = self.in_flight  # new limits start a new window: an earlier run's peak is not ours
            self._cond.notify_all()
        return self

    @contextmanager
    def slot(self) -> Iterator[None]:
        """Hold one of the ``max_concurrency`` slots for the body (blocks until one is free)."""
        with self._cond:
            while self.in_flight >= self.max_concurrency:
                self._cond.wait()
            self.in_flight += 1
            self.in_flight_max = max(self.in_flight_max, self.in_flight)
        try:
            yield
        finally:
            with self._cond:
                self.in_flight -= 1
                self._cond.notify_all()

    def admit(self, deadline: float | None = None) -> bool:
        """Wait until one more request keeps the last minute within ``requests_per_minute``, and count it.

        ``deadline`` (``time.monotonic()``): give up at that time and return False (the request is not sent).
        """
        with self._cond:
            while True:
                now = time.monotonic()
                while self._sent and now - self._sent[0] >= WINDOW_S:
                    self._sent.popleft()
                if self.requests_per_minute <= 0 or len(self._sent) < self.requests_per_minute:
                    self._sent.append(now)
                    self.requests += 1
                    return True
                wait = WINDOW_S - (now - self._sent[0])
                if deadline is not None:
                    if now >= deadline:
                        return False
                    wait = min(wait, deadline - now)
                self._cond.wait(timeout=max(wait, 0.001))

    def window(self) -> dict[str, float]:
        """``in_flight_max`` since the last call (then restarted from what is in flight now)."""
        with self._cond:
            out = {"in_flight_max": float(self.in_flight_max)}
            self.in_flight_max = self.in_flight
        return out


_SHARED: Limiter | None = None
_SHARED_LOCK = threading.Lock()


def shared_limiter() -> Limiter:
    """The process's limiter, which every :class:`~score_lightning.clients.chat.ChatClient` uses unless given
    its own. Until :func:`configure_limiter` sets it: 8 calls in flight, no requests-per-minute limit."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = Limiter()
        return _SHARED


def configure_limiter(max_concurrency: int, requests_per_minute: int = 0) -> Limiter:
    """Set the process's limits (a run does it from ``judge.max_concurrency`` and ``judge.requests_per_minute``,
    ``evaluate.py judge`` from ``--concurrency`` and ``--requests-per-minute``)."""
    return shared_limiter().configure(max_concurrency, requests_per_minute)
