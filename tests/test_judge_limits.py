"""The process-wide limiter and the LLM judge's client, against a real loopback OpenAI-compatible server that
injects faults: 429 with Retry-After, a hang past the deadline, 500, garbage. Failures come back as kinds,
never as values, the server never holds more than max_concurrency requests, and a hang costs the deadline."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from omegaconf import DictConfig, OmegaConf

from helpers import ROOT
from openai_stub import OpenAIStub, Reply
from score_lightning.clients import limiter as L
from score_lightning.clients.chat import ChatClient
from score_lightning.clients.judge import JudgeTally
from score_lightning.methods.judge.client import LLMJudge
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


def _settings(base_url: str, **kw) -> DictConfig:
    """The ``judge`` group as a run passes it (configs/judge/default.yaml, its defaults), at ``base_url``."""
    return OmegaConf.merge(OmegaConf.load(ROOT / "configs" / "judge" / "default.yaml"),
                           {"base_url": base_url, "model": "judge-x", "api_key_env": None, **kw})


def _judge(stub: OpenAIStub, **kw) -> LLMJudge:
    settings = _settings(stub.base_url, **kw)
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
    go through the one limiter the process configures, so together they never exceed its max_concurrency."""
    shared = Limiter(max_concurrency=4)
    monkeypatch.setattr(L, "_SHARED", shared)
    with OpenAIStub(content="SCORE 3", delay_s=0.15) as stub:
        L.configure_limiter(2)  # the process's share of the run's limit (configure_limits, below)
        judge = LLMJudge(_settings(stub.base_url, max_concurrency=2))
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


def test_a_call_that_finds_no_free_slot_fails_as_queue_timeout_in_bounded_time():
    """Every slot held by calls that do not end (here: held by hand): a judgement waits judge.queue_timeout_s, then
    fails as its own kind, counted, with nothing sent; never a hang. Once a slot frees, calls go through again."""
    lim = Limiter(max_concurrency=1, queue_timeout_s=0.3)
    with OpenAIStub(content="SCORE 4") as stub:
        judge = LLMJudge(_settings(stub.base_url, timeout_s=5.0), limiter=lim)
        assert lim.acquire()  # another caller's call that holds the only slot
        box: dict = {}
        t0 = time.monotonic()
        waiter = threading.Thread(target=lambda: box.update(out=judge.judge([([{"role": "user", "content": "r 4"}],
                                                                              _score)] * 2)), daemon=True)
        waiter.start()
        waiter.join(timeout=5.0)
        took = time.monotonic() - t0
        assert not waiter.is_alive(), "the wait for a slot has no deadline"
        outcomes = box["out"]
        tally = JudgeTally(endpoint="stub")
        tally.add(outcomes)
        assert [o.error for o in outcomes] == ["queue_timeout", "queue_timeout"] and 0.25 < took < 2.0
        assert [o.attempts for o in outcomes] == [0, 0] and stub.chat_requests == []  # nothing was sent
        assert "no free slot of 1" in outcomes[0].detail
        assert tally.failed == 2 and tally.kinds == {"queue_timeout": 2}
        lim.release()
        assert judge.chat.ask([{"role": "user", "content": "r 4"}], _score).value == 4.0 and lim.in_flight == 0


class Trickle:
    """A loopback chat-completions server that sends its headers at once, then its (valid) body one byte every
    ``gap_s``: each read gets a byte long before any read timeout, so only a bound on the whole reply ends it.
    ``hangups`` records when each client closed its connection (seconds after its request arrived)."""

    def __init__(self, gap_s: float = 0.02) -> None:
        trickle = self
        self.gap_s, self.hangups, self.requests = gap_s, [], 0
        self.stop = threading.Event()
        body = json.dumps({"id": "c1", "object": "chat.completion", "created": 0, "model": "judge-x",
                           "choices": [{"index": 0, "finish_reason": "stop",
                                        "message": {"role": "assistant", "content": "SCORE 7" + " " * 200}}]}).encode()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                arrived = time.monotonic()
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                trickle.requests += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    for i in range(len(body)):
                        if trickle.stop.wait(trickle.gap_s):
                            return
                        self.wfile.write(body[i:i + 1])
                except (BrokenPipeError, ConnectionResetError):
                    trickle.hangups.append(time.monotonic() - arrived)
                    self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.seconds = len(body) * gap_s  # the whole reply, were it read to the end
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def __enter__(self) -> "Trickle":
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def _settle(lim: Limiter, within_s: float) -> float:
    """Seconds until the limiter's slots are all free again (at most ``within_s``)."""
    t0 = time.monotonic()
    while lim.in_flight and time.monotonic() - t0 < within_s:
        time.sleep(0.01)
    return time.monotonic() - t0


def test_a_server_trickling_its_body_cannot_hold_a_judgement_or_its_slot_past_the_deadline():
    """The judge's deadline bounds the whole call: a body still arriving at it is dropped there, the slot is free
    again right after, no retry is sent, and the judgement counts as a timeout."""
    lim = Limiter(max_concurrency=1)
    with Trickle() as server:
        assert server.seconds > 4.0
        judge = LLMJudge(_settings(server.url, timeout_s=0.6, max_retries=2), limiter=lim)
        t0 = time.monotonic()
        out = judge.chat.ask([{"role": "user", "content": "judge report 7"}], _score)
        took = time.monotonic() - t0
        freed = _settle(lim, within_s=6.0)
        time.sleep(0.2)
        hangups, sent = list(server.hangups), server.requests
    assert out.error == "timeout" and 0.55 < took < 1.0
    assert freed < 0.3  # the slot is not held while the server keeps trickling
    assert sent == 1 and len(hangups) == 1 and hangups[0] < 1.0  # the connection was closed at the deadline
    tally = JudgeTally(endpoint="trickle")
    tally.add([out])
    assert tally.failed == 1 and tally.kinds == {"timeout": 1}


def test_timeout_s_bounds_a_whole_request_of_a_client_without_deadline():
    """The meta-harness, rubric writer and appraisal set no call deadline: timeout_s still bounds each request, its
    body included, so a trickling server costs timeout_s per attempt, not the length of its trickle."""
    lim = Limiter(max_concurrency=2)
    with Trickle() as server:
        client = ChatClient(server.url, "writer", timeout_s=0.5, max_retries=1, limiter=lim)
        t0 = time.monotonic()
        out = client.ask([{"role": "user", "content": "write 7"}], _score)
        took = time.monotonic() - t0
        freed = _settle(lim, within_s=6.0)
        sent = server.requests
    assert out.error == "timeout" and out.attempts == 2 and sent == 2  # one SDK retry, each cut at timeout_s
    assert 1.0 < took < 2.5 and freed < 0.3


def test_the_run_limits_are_split_among_the_processes_that_call():
    """process_share by hand: 7 over 3 processes is 3 + 2 + 2 (the remainder to the first), 8 over 2 is 4 + 4;
    0 (unlimited) stays 0; a share below 1 is 1 (config validation refuses a used judge there)."""
    assert [L.process_share(7, i, 3) for i in range(3)] == [3, 2, 2]
    assert [L.process_share(8, i, 2) for i in range(2)] == [4, 4]
    assert [L.process_share(0, i, 2) for i in range(2)] == [0, 0]
    assert [L.process_share(1, i, 2) for i in range(2)] == [1, 1]
    with pytest.raises(ValueError, match="process 2 of 2"):
        L.process_share(4, 2, 2)


@pytest.mark.parametrize("mode, rank, world, worker, expect", [
    ("sync", 0, 2, False, (3, 50)),  # rank 0 of 2: 5 // 2 + 1, 100 // 2
    ("sync", 1, 2, False, (2, 50)),
    ("sync", 0, 1, False, (5, 100)),  # one process: the whole limit
    ("async", 0, 1, False, (3, 50)),  # the trainer and its rollout worker share it
    ("async", 0, 1, True, (2, 50)),
])
def test_each_process_configures_its_share_of_the_run_limits(monkeypatch, mode, rank, world, worker, expect):
    from omegaconf import OmegaConf

    from score_lightning.clients.limiter import configure_limits

    shared = Limiter(max_concurrency=8)
    monkeypatch.setattr(L, "_SHARED", shared)
    cfg = OmegaConf.create({"rollout": {"mode": mode}, "judge": {"max_concurrency": 5, "requests_per_minute": 100,
                                                                 "queue_timeout_s": 12.0}})
    configure_limits(cfg.judge, cfg.rollout, rank, world, worker=worker)
    assert (shared.max_concurrency, shared.requests_per_minute, shared.queue_timeout_s) == (*expect, 12.0)


def test_a_share_raised_to_one_is_said_at_the_first_call_only(monkeypatch, caplog):
    """Without a judge (an LLM meta-harness alone) a limit below the process count is not refused: each process
    gets 1, and the first call of a process that does call says the run may exceed the limit, once."""
    from omegaconf import OmegaConf

    from score_lightning.clients.limiter import configure_limits

    shared = Limiter(max_concurrency=8)
    monkeypatch.setattr(L, "_SHARED", shared)
    cfg = OmegaConf.create({"rollout": {"mode": "sync"}, "judge": {"max_concurrency": 1, "requests_per_minute": 0,
                                                                   "queue_timeout_s": 5.0}})
    with caplog.at_level("WARNING", logger="score_lightning.clients.limiter"):
        configure_limits(cfg.judge, cfg.rollout, 1, 2)
        assert shared.max_concurrency == 1 and caplog.records == []  # nothing said before a call
        for _ in range(2):
            with shared.slot():
                pass
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "judge.max_concurrency=1" in said[0] and "below the 2 processes" in said[0]


def test_a_used_judge_with_fewer_calls_than_calling_processes_is_refused_by_name():
    from helpers import compose
    from score_lightning.launch.config_validation import ConfigError, validate_config

    base = ["experiment=grpo_judge_tiny", "strategy=ddp", "trainer.devices=2", "data.batch_size=2",
            "optim.mini_batch_size=2"]
    validate_config(compose([*base, "judge.max_concurrency=2", "judge.requests_per_minute=2"]))
    with pytest.raises(ConfigError) as err:
        validate_config(compose([*base, "judge.max_concurrency=1", "judge.requests_per_minute=1"]))
    assert "judge.max_concurrency=1 is the whole run's limit, split among the 2 processes" in str(err.value)
    assert "set judge.requests_per_minute >= 2" in str(err.value)
    with pytest.raises(ConfigError, match=r"\(1 training process and the async rollout worker\).*"
                                          r"set judge.max_concurrency >= 2"):
        validate_config(compose(["experiment=grpo_judge_tiny", "rollout.mode=async", "judge.max_concurrency=1"]))


DIM = re.compile(r"^- ([a-z][a-z0-9_]*) \(weight ", re.MULTILINE)


def _slow_evaluation(request: dict):
    """A judge that takes 1.5 s per reply and scores every rubric dimension of the prompt 6."""
    scores = "".join(f'<score dim="{d}" value="6" reason="r"/>' for d in DIM.findall(request["messages"][1]["content"]))
    return Reply(content='<report_evaluations><report id="1"><verification>checked</verification><gap_analysis>none'
                         f"</gap_analysis><scores>{scores}</scores></report></report_evaluations>", delay_s=1.5)


@pytest.mark.multiprocess  # two training processes: make test-multiprocess (CI runs it)
def test_two_ddp_ranks_together_never_hold_more_than_judge_max_concurrency_calls(tmp_path, tiny_ckpt, corpus_file):
    """judge.max_concurrency is the run's: 2 DDP ranks, each judging its 4 reports at once against a judge that takes
    1.5 s a reply, hold at most 2 calls at the server together (each rank its share, 1), not 2 each."""
    from helpers import FAST, ROOT

    base = [o for o in FAST if not o.startswith(("experiment=", "solver.num_rollouts", "data.batch_size",
                                                  "optim.mini_batch_size", "optim.micro_batch_size"))]
    with OpenAIStub(content=_slow_evaluation) as stub:
        cmd = [sys.executable, "src/train.py", "experiment=grpo_judge_tiny", *base, "rollout=scripted",
               "strategy=ddp", "trainer.devices=2", "solver.num_rollouts=4", "data.batch_size=2",
               "optim.mini_batch_size=2", "optim.micro_batch_size=4", "trainer.max_steps=1",
               "solver.max_response_tokens=160", f"paths.output_dir={tmp_path}", f"judge.base_url={stub.base_url}", "judge.model=judge-x",
               "judge.api_key_env=null", "judge.max_concurrency=2", "judge.timeout_s=20",
               "judge.max_failed_rate=1.0"]
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
        most, sent = stub.in_flight_max, len(stub.chat_requests)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert sent >= 4  # both ranks judged (the scripted solver's uncited reports are judged too)
    assert 1 <= most <= 2, (most, sent)  # never more than judge.max_concurrency in flight, over both ranks
