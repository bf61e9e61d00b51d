"""The process-wide limiter and the LLM judge's client, against a real loopback OpenAI-compatible server that
injects faults: 429 with Retry-After, a hang past the deadline, 500, garbage. Failures come back as kinds,
never as values, the server never holds more than max_concurrency requests, and a hang costs the deadline."""

from __future__ import annotations

import threading
import time

import pytest

from openai_stub import OpenAIStub, Reply
from score_lightning.clients import limiter as L
from score_lightning.clients.chat import ChatClient
from score_lightning.clients.judge import JudgeSettings, JudgeTally, LLMJudge
from score_lightning.clients.limiter import Limiter


def test_the_limiter_bounds_slots_across_threads_and_records_the_most_in_flight():
    lim = Limiter(max_concurrency=3)
    now, most = [0], [0]
    lock = threading.Lock()

    def work():
        with lim.slot():
            with lock:
                now[0] += 1
                most[0] = max(most[0], now[0])
            time.sleep(0.02)
            with lock:
                now[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 3 and lim.window() == {"in_flight_max": 3.0} and lim.window() == {"in_flight_max": 0.0}
    with pytest.raises(ValueError, match="max_concurrency"):
        lim.configure(0)


def test_new_limits_start_a_new_window():
    """A run that configures the shared limiter must not report the peak of an earlier run in the process."""
    lim = Limiter(max_concurrency=4)
    release = threading.Event()

    def hold():
        with lim.slot():
            release.wait()

    held = [threading.Thread(target=hold) for _ in range(3)]
    for t in held:
        t.start()
    while lim.in_flight < 3:
        time.sleep(0.001)
    release.set()
    for t in held:
        t.join()
    assert lim.in_flight == 0 and lim.in_flight_max == 3  # the earlier run's peak, never read
    lim.configure(2)
    assert lim.window() == {"in_flight_max": 0.0}


def test_requests_per_minute_is_a_sliding_window(monkeypatch):
    monkeypatch.setattr(L, "WINDOW_S", 0.3)
    lim = Limiter(max_concurrency=8, requests_per_minute=2)
    t0 = time.monotonic()
    assert lim.admit() and lim.admit()
    assert time.monotonic() - t0 < 0.1  # two within the window pass at once
    assert not lim.admit(deadline=time.monotonic() + 0.05)  # a third must wait for the window: not by then
    assert lim.admit()  # ... and gets through when the first leaves it
    assert 0.25 < time.monotonic() - t0 < 1.0 and lim.requests == 3


def _judge(stub: OpenAIStub, **kw) -> LLMJudge:
    settings = JudgeSettings(stub.base_url, "judge-x", api_key_env=None, **kw)
    return LLMJudge(settings, limiter=Limiter(settings.max_concurrency, settings.requests_per_minute))


def _score(text: str) -> float:
    if not text.startswith("SCORE "):
        raise ValueError(f"not a score: {text[:40]!r}")
    return float(text.split()[1])


FAULTS = {1: "429", 2: "hang", 3: "500", 4: "garbage"}


def _faulty(request: dict):
    """Report i answers ``SCORE i``, unless it is one of FAULTS (every attempt: the fault persists)."""
    i = int(request["messages"][0]["content"].split()[-1])  # re-asks append messages after it
    kind = FAULTS.get(i)
    if kind == "429":
        return Reply(status=429, headers={"Retry-After": "0.05"})
    if kind == "hang":
        return Reply(content="SCORE 9", delay_s=5.0)
    if kind == "500":
        return Reply(status=500)
    if kind == "garbage":
        return "I would rather not say."
    return Reply(content=f"SCORE {i}", delay_s=0.05)


def test_faults_become_error_kinds_never_scores_and_the_server_sees_at_most_max_concurrency():
    with OpenAIStub(content=_faulty) as stub:
        judge = _judge(stub, max_concurrency=2, timeout_s=0.6, max_retries=1)
        requests = [([{"role": "user", "content": f"judge report {i}"}], _score) for i in range(10)]
        t0 = time.monotonic()
        outcomes = judge.judge(requests)
        wall = time.monotonic() - t0
        tally = JudgeTally(endpoint="stub")
        tally.add(outcomes)
        in_flight = stub.in_flight_max
    assert [o.value for o in outcomes] == [0.0, None, None, None, None, 5.0, 6.0, 7.0, 8.0, 9.0]
    assert [o.error for o in outcomes[:5]] == [None, "http_429", "timeout", "http_500", "unparseable"]
    assert tally.failed == 4 and tally.failed_rate == pytest.approx(0.4)
    assert tally.kinds == {"http_429": 1, "timeout": 1, "http_500": 1, "unparseable": 1}
    assert "4 of 10 judgements failed at stub" in tally.describe() and "timeout x1" in tally.describe()
    assert outcomes[1].attempts == 2 and outcomes[3].attempts == 2  # one SDK retry each, then the kind
    assert outcomes[4].attempts == 2  # the garbage reply was asked again once, with the reason
    assert 0.55 < outcomes[2].latency_s < 1.0  # the hang cost the deadline, not the server's 5 s
    assert in_flight <= 2  # the server never held more than max_concurrency requests
    assert wall < 4.0


def test_the_deadline_is_hard_and_no_retry_is_sent_after_it():
    """A server that hangs past timeout_s: the call fails at the deadline, and the SDK's retry that would follow
    the first request's timeout is never sent."""
    with OpenAIStub(content="SCORE 1", delay_s=3.0) as stub:
        judge = _judge(stub, max_concurrency=1, timeout_s=0.4, max_retries=3)
        t0 = time.monotonic()
        out = judge.chat.ask([{"role": "user", "content": "judge report 0"}], _score)
        took = time.monotonic() - t0
        time.sleep(1.5)  # long enough for SDK retries to show up if any were sent
        sent = len(stub.chat_requests)
    assert out.error == "timeout" and "deadline" in out.detail and took < 0.8
    assert sent == 1


def test_every_chat_client_shares_the_process_limiter(monkeypatch):
    """The meta-harness, the rubric writer, the appraisal and evaluate.py judge build plain ChatClients: they all
    go through the one limiter the judge configures, so together they never exceed its max_concurrency."""
    shared = Limiter(max_concurrency=4)
    monkeypatch.setattr(L, "_SHARED", shared)
    with OpenAIStub(content="SCORE 3", delay_s=0.15) as stub:
        judge = LLMJudge(JudgeSettings(stub.base_url, "judge-x", api_key_env=None, max_concurrency=2))
        assert judge.limiter is shared and shared.max_concurrency == 2
        others = [ChatClient(stub.base_url, "other") for _ in range(3)]
        threads = [threading.Thread(target=c.ask, args=([{"role": "user", "content": "x 1"}], _score))
                   for c in others for _ in range(2)]
        for t in threads:
            t.start()
        judge.judge([([{"role": "user", "content": "report 2"}], _score)] * 4)
        for t in threads:
            t.join()
        assert stub.in_flight_max == 2 and len(stub.chat_requests) == 10
