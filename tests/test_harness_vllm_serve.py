"""LLMHarness against a real OpenAI-compatible server: ``vllm serve`` on the tiny model (marked vllm).

The tiny model is random, so a successful refresh needs vLLM's structured outputs (sent through the
harness's ``extra_body``): the schema pins every field to valid values except the booleans, which
the model really chooses. That still exercises the whole path: SDK request, the server's chat
template and sampling, ``finish_reason``, reply parsing and state validation.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.vllm  # conftest fails these tests when vllm cannot be imported


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
         "--max-model-len", "4096"],
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


#: A JSON schema whose every instance is a valid reply (k*weight_min <= 1 <= k*weight_max for k in {3, 4}).
REPLY_SCHEMA = {
    "type": "object",
    "properties": {
        "dimension_constraints": {
            "type": "object",
            "properties": {"k": {"enum": [3, 4]}, "must_include": {"enum": [["factual_support"]]},
                           "weight_min": {"enum": [0.1]}, "weight_max": {"enum": [0.5]}},
            "required": ["k", "must_include", "weight_min", "weight_max"], "additionalProperties": False,
        },
        "process_constraints": {
            "type": "object",
            "properties": {"require_gap_analysis": {"type": "boolean"}, "require_verification": {"type": "boolean"},
                           "citation_cross_check": {"type": "boolean"}, "min_number_of_tool_call": {"enum": [1, 2]}},
            "required": ["require_gap_analysis", "require_verification", "citation_cross_check",
                         "min_number_of_tool_call"],
            "additionalProperties": False,
        },
        "notes": {"enum": ["verify claims by search"]},
    },
    "required": ["dimension_constraints", "process_constraints", "notes"],
    "additionalProperties": False,
}


def test_llm_harness_refresh_succeeds_against_vllm_serve(vllm_server):
    from score_lightning.harness.llm import LLMHarness
    from score_lightning.harness.state import HarnessState

    harness = LLMHarness(base_url=vllm_server, model="tiny", api_key_env=None, timeout_s=120, max_retries=0,
                         max_tokens=512, temperature=1.0,
                         extra_body={"structured_outputs": {"json": REPLY_SCHEMA, "disable_any_whitespace": True}})
    state = HarnessState.from_dict({"version": 7})
    new = harness.update(state, {"verified_rate": 0.2, "consistency": 0.5, "verification_depth_mean": 0.4})
    assert (harness.failures, harness.last_error) == (0, "")
    assert new is not state and new.version == 8
    dc, pc = new.dimension_constraints, new.process_constraints
    assert dc.k in (3, 4) and (dc.weight_min, dc.weight_max) == (0.1, 0.5) and dc.must_include == ["factual_support"]
    assert pc.min_number_of_tool_call in (1, 2) and new.notes == "verify claims by search"
    assert new.dimension_pool == state.dimension_pool and harness.chat.num_requests == 1


def test_llm_harness_keeps_state_on_a_free_reply(vllm_server):
    """Unconstrained, the random model's reply is no valid state JSON (or is cut at max_tokens):
    the harness keeps the previous state, counts a failure and says why (no HTTP-level error)."""
    from score_lightning.harness.llm import LLMHarness
    from score_lightning.harness.state import HarnessState

    harness = LLMHarness(base_url=vllm_server, model="tiny", timeout_s=120, max_retries=0, max_tokens=64)
    state = HarnessState()
    new = harness.update(state, {"verified_rate": 0.2, "consistency": 0.5})
    assert new is state and harness.failures == 1
    assert harness.last_error.startswith("invalid reply:"), harness.last_error
    assert harness.chat.num_requests == 1
