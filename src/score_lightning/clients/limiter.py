"""One limit on the requests a process sends to external LLM endpoints, and its share of the run's.

Peers' users report judges that hung a whole run (verl PR #6673) or fanned out without bound (NeMo-Gym
#3023); verl's rate-limited reward manager (PR #4107) bounds concurrency and requests per minute. Here every
chat call of the process (the LLM judge, the meta-harness, the rubric writer, the rubric appraisal,
``evaluate.py judge``) goes through one :class:`Limiter`:

* **in flight**: at most ``max_concurrency`` calls hold a slot at once, whichever client or thread makes
  them. A call holds its slot from its first HTTP request until its last one has ended (the SDK's retries
  run one after another inside it), also when its caller stopped waiting at the deadline, so the server
  never sees more than ``max_concurrency`` requests from this process;
* **requests per minute** (``requests_per_minute``, 0 = unlimited): every HTTP request, each SDK retry
  included, waits until it is at most the N-th sent in the last 60 s (a sliding window);
* **queue timeout**: a call waits at most ``queue_timeout_s`` for its slot and its first request's token,
  then fails as ``queue_timeout`` (counted like any failed call, never a hang).

A run's limits (``judge.max_concurrency``, ``judge.requests_per_minute``) are the whole run's: each process
that makes calls (every training process, and the asynchronous rollout worker) configures its
:func:`process_share` of them, so the shares add up to the run's limit with no traffic between processes.

``in_flight_max`` is the most calls in flight at once since :meth:`Limiter.window` was last read (the step
logs it as ``judge/in_flight_max``). The per-call deadline is the client's (``clients/chat.py``).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

WINDOW_S = 60.0  # the requests-per-minute window
QUEUE_TIMEOUT_S = 300.0  # a process whose limits no run configured (evaluate.py judge): judge.queue_timeout_s's default


class Limiter:
    """Slots for calls in flight and a sliding one-minute window for requests; thread-safe."""

    def __init__(self, max_concurrency: int = 8, requests_per_minute: int = 0,
                 queue_timeout_s: float = QUEUE_TIMEOUT_S) -> None:
        self._cond = threading.Condition()
        self.in_flight = 0
        self.in_flight_max = 0  # since the last window()
        self.requests = 0  # HTTP requests let through, all time
        self._sent: collections.deque[float] = collections.deque()
        self.notice = ""  # logged once, at the first call that takes a slot (see configure_limiter)
        self.configure(max_concurrency, requests_per_minute, queue_timeout_s)

    def configure(self, max_concurrency: int, requests_per_minute: int = 0,
                  queue_timeout_s: float = QUEUE_TIMEOUT_S) -> "Limiter":
        """Set the limits (callers waiting for a slot see a raised one at once)."""
        if int(max_concurrency) < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if int(requests_per_minute) < 0:
            raise ValueError(f"requests_per_minute must be >= 0 (0: unlimited), got {requests_per_minute}")
        if not float(queue_timeout_s) > 0:
            raise ValueError(f"queue_timeout_s must be > 0, got {queue_timeout_s}")
        with self._cond:
            self.max_concurrency = int(max_concurrency)
            self.requests_per_minute = int(requests_per_minute)
            self.queue_timeout_s = float(queue_timeout_s)
            self.in_flight_max = self.in_flight  # new limits start a new window: an earlier run's peak is not ours
            self._cond.notify_all()
        return self

    def acquire(self, deadline: float | None = None) -> bool:
        """Take one of the ``max_concurrency`` slots; False when none is free by ``deadline``
        (``time.monotonic()``; None: wait as long as it takes). Give it back with :meth:`release`."""
        with self._cond:
            if self.notice:  # only a process that does call hears it
                logging.getLogger(__name__).warning(self.notice)
                self.notice = ""
            while self.in_flight >= self.max_concurrency:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(timeout=left)
            self.in_flight += 1
            self.in_flight_max = max(self.in_flight_max, self.in_flight)
            return True

    def release(self) -> None:
        with self._cond:
            self.in_flight -= 1
            self._cond.notify_all()

    @contextmanager
    def slot(self, deadline: float | None = None) -> Iterator[None]:
        """Hold a slot for the body; :class:`TimeoutError` when none is free by ``deadline``."""
        if not self.acquire(deadline):
            raise TimeoutError(f"no free slot of {self.max_concurrency} by the deadline")
        try:
            yield
        finally:
            self.release()

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


def configure_limiter(max_concurrency: int, requests_per_minute: int = 0,
                      queue_timeout_s: float = QUEUE_TIMEOUT_S, notice: str = "") -> Limiter:
    """Set the process's limits (a run does it with its shares of ``judge.max_concurrency`` and
    ``judge.requests_per_minute``, ``evaluate.py judge`` from ``--concurrency`` and ``--requests-per-minute``).
    ``notice`` is logged at the process's first call, if it makes one (a share raised to 1)."""
    limiter = shared_limiter().configure(max_concurrency, requests_per_minute, queue_timeout_s)
    limiter.notice = notice
    return limiter


def process_share(total: int, index: int, processes: int) -> int:
    """Process ``index``'s part of a run-wide limit split among ``processes``: ``total // processes``, plus one
    for the first ``total % processes`` processes, so the parts add up to ``total`` (0, unlimited, stays 0).
    A part that would be 0 is 1: a process cannot call with no slot (config validation refuses a judge whose
    limit is below the process count; otherwise the run exceeds ``total``, with a warning at its start)."""
    if processes < 1 or not 0 <= index < processes:
        raise ValueError(f"process {index} of {processes}: need 0 <= index < processes")
    if total <= 0:
        return 0
    return max(1, total // processes + (1 if index < total % processes else 0))


def configure_limits(judge, rollout, rank: int, world_size: int, worker: bool = False) -> None:
    """This process's limits on every external chat call (judge, meta-harness, rubric writer, appraisal): its
    share of the run's ``judge.max_concurrency`` and ``judge.requests_per_minute``, split among the processes
    that make calls (the ``world_size`` training processes, and the rollout worker under ``rollout.mode=async``,
    which counts after them), so that the endpoint sees the run's limits with no traffic between processes. A
    process calls it before its first request. ``judge`` and ``rollout`` are the run's nodes of those names (this
    package, below the config schema, reads them by attribute)."""
    processes = int(world_size) + (1 if str(rollout.mode) == "async" else 0)
    index = int(world_size) if worker else int(rank)
    total, rpm = int(judge.max_concurrency), int(judge.requests_per_minute)
    short = total < processes or 0 < rpm < processes  # refused by config validation when the judge is used
    notice = (f"judge.max_concurrency={total} / judge.requests_per_minute={rpm} are the run's limits, below the "
              f"{processes} processes that may make external chat calls: each still gets 1, so the run may exceed "
              "them") if short else ""
    configure_limiter(process_share(total, index, processes), process_share(rpm, index, processes),
                      float(judge.queue_timeout_s), notice)
