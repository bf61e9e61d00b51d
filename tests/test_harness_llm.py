"""LLMHarness through the official openai SDK against a real loopback chat-completions server:
valid replies, pool edits, truncation, transport retries (the SDK's) and semantic retries (ours)."""

from __future__ import annotations

import json
import pickle
import socket
import time

import pytest
from omegaconf import OmegaConf

from openai_stub import OpenAIStub, Reply, openai_stub  # noqa: F401  (fixture)
from score_lightning.clients.chat import PLACEHOLDER_API_KEY
from score_lightning.harness.llm import LLMHarness, extract_json_object
from score_lightning.harness.state import DEFAULT_DIMENSION_POOL, HarnessState

GOOD_REPLY = """Here are the new constraints:
```json
{"dimension_constraints": {"k": 5, "must_include": ["factual_support"], "weight_min": 0.1, "weight_max": 0.4},
 "process_constraints": {"require_gap_analysis": true, "min_number_of_tool_call": 2},
 "notes": "Rubrics saturate; analyse gaps.", "version": 99}
```"""


def make_state(version: int = 3, **dc: object) -> HarnessState:
    return HarnessState.from_dict({"dimension_constraints": dc, "version": version})


def llm(stub: OpenAIStub, **kw: object) -> LLMHarness:
    return LLMHarness(stub.base_url, "harness-model", **kw)  # type: ignore[arg-type]


def user_payload(request_json: dict) -> dict:
    user = request_json["messages"][1]["content"]
    return json.loads(user[user.index("{"): user.rindex("}") + 1])


def assert_failed(h: LLMHarness, state: HarnessState, new: HarnessState, why: str, failures: int = 1) -> None:
    assert new is state and new.version == state.version
    assert h.failures == failures
    assert why in h.last_error, h.last_error


def test_valid_reply_updates_state_and_sends_request(openai_stub: OpenAIStub, monkeypatch) -> None:
    monkeypatch.setenv("HARNESS_KEY", "sk-test-123")
    openai_stub.content = GOOD_REPLY
    extra = OmegaConf.create({"top_k": 5, "structured_outputs": {"choice": ["a", "b"]}})  # as Hydra passes it
    h = llm(openai_stub, api_key_env="HARNESS_KEY", max_tokens=333, extra_body=extra)
    state = make_state(version=3)
    new = h.update(state, {"verified_rate": 0.4, "consistency": 0.85, "verification_depth_mean": 0.5, "bogus": "x"})
    assert new.version == 4  # bumped by the harness, the reply's "version" is ignored
    assert (new.dimension_constraints.k, new.dimension_constraints.weight_max) == (5, 0.4)
    assert new.process_constraints.require_gap_analysis is True
    assert new.process_constraints.min_number_of_tool_call == 2
    assert new.process_constraints.require_verification is state.process_constraints.require_verification  # from base
    assert new.notes == "Rubrics saturate; analyse gaps."
    assert new.dimension_pool == state.dimension_pool  # no pool in the reply: pool kept
    assert state.dimension_constraints.k == 4 and state.version == 3  # input untouched
    assert (h.failures, h.last_error) == (0, "")

    (req,) = openai_stub.chat_requests
    assert req.path == "/v1/chat/completions"
    assert req.header("Authorization") == "Bearer sk-test-123"
    assert req.json["model"] == "harness-model" and req.json["temperature"] == 0.0
    assert req.json["max_tokens"] == 333 and req.json["top_k"] == 5  # extra_body merged into the body
    assert req.json["structured_outputs"] == {"choice": ["a", "b"]}
    assert [m["role"] for m in req.json["messages"]] == ["system", "user"]
    system = req.json["messages"][0]["content"]
    assert "never choose" in system.lower() and "WHOLE new pool" in system and "verification_depth_mean" in system
    payload = user_payload(req.json)
    assert payload["statistics"] == {"consistency": 0.85, "verification_depth_mean": 0.5, "verified_rate": 0.4}
    assert payload["current_constraints"]["dimension_constraints"]["k"] == 4
    assert payload["dimension_pool"] == DEFAULT_DIMENSION_POOL  # with definitions: the LLM may resend it
    assert "base_constraints" not in payload


def test_pool_edits_off_sends_names_and_forbids_pool(openai_stub: OpenAIStub) -> None:
    openai_stub.content = GOOD_REPLY
    base = {"dimension_constraints": {"k": 3, "weight_max": 0.6}}
    h = llm(openai_stub, allow_pool_edits=False, base_state=base)
    assert h.update(make_state(), {}).version == 4
    req = openai_stub.chat_requests[0].json
    payload = user_payload(req)
    assert payload["dimension_pool"] == list(DEFAULT_DIMENSION_POOL)
    assert "Claims are correct" not in req["messages"][1]["content"]
    assert payload["base_constraints"]["dimension_constraints"]["k"] == 3
    assert 'Do not include "dimension_pool"' in req["messages"][0]["content"]


def test_without_key_sends_placeholder_not_openai_env(openai_stub: OpenAIStub, monkeypatch) -> None:
    """No key configured: the SDK needs one, local servers ignore it; $OPENAI_API_KEY must not leak in."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-must-not-be-sent")
    monkeypatch.delenv("UNSET_HARNESS_KEY", raising=False)
    openai_stub.content = GOOD_REPLY
    assert llm(openai_stub, api_key_env="UNSET_HARNESS_KEY").update(make_state(), {}).version == 4
    assert llm(openai_stub, api_key_env=None).update(make_state(), {}).version == 4
    assert [r.header("Authorization") for r in openai_stub.chat_requests] == [f"Bearer {PLACEHOLDER_API_KEY}"] * 2


POOL = {"factual_support": "Claims are backed by the retrieved evidence.",
        "source_diversity": "  Evidence comes from several independent documents.  ",
        "readability": "Clear prose."}


def test_pool_edit_accepted(openai_stub: OpenAIStub) -> None:
    openai_stub.content = json.dumps({"dimension_constraints": {"k": 2, "weight_max": 0.6}, "dimension_pool": POOL,
                                      "notes": "Reward source diversity."})
    h = llm(openai_stub)
    new = h.update(make_state(), {"dims/insight_freq": 0.0})
    assert h.failures == 0, h.last_error
    assert new.dimension_pool == {**POOL, "source_diversity": "Evidence comes from several independent documents."}
    assert new.dimension_constraints.k == 2 and new.version == 4


@pytest.mark.parametrize("pool,kw,why", [
    ({"factual_support": "a", "Bad Name": "b"}, {}, "must match"),
    ({"factual_support": "a", "readability": ""}, {}, "one non-empty line"),
    ({"factual_support": "a", "readability": "two\nlines"}, {}, "one non-empty line"),
    ({"factual_support": "a"}, {}, "allowed 2 to 24"),
    ({f"dim_{i}": "d" for i in range(5)} | {"factual_support": "a"}, {"max_pool_size": 4}, "allowed 2 to 4"),
    ({"readability": "a", "insight": "b", "conciseness": "c", "comprehensiveness": "d"}, {}, "unknown dimension"),
    (["factual_support", "readability"], {}, "must be an object"),
    (POOL, {"allow_pool_edits": False}, "pool edits are disabled"),
])
def test_pool_edit_refused_keeps_state(openai_stub: OpenAIStub, pool, kw: dict, why: str) -> None:
    # "unknown dimension": the pool drops factual_support, which must_include still names.
    openai_stub.content = json.dumps({"dimension_constraints": {"k": 3, "weight_max": 0.6}, "dimension_pool": pool})
    h, state = llm(openai_stub, max_retries=0, **kw), make_state()
    assert_failed(h, state, h.update(state, {}), why)
    assert h.last_error.startswith("invalid reply")


def test_refused_pool_edit_is_reasked_and_fixed(openai_stub: OpenAIStub) -> None:
    bad = json.dumps({"dimension_constraints": {"k": 3, "weight_max": 0.6}, "dimension_pool": {"x": "1-char name", "readability": "r"}})
    openai_stub.script(bad, GOOD_REPLY)
    h = llm(openai_stub, max_retries=1)
    new = h.update(make_state(), {})
    assert h.failures == 0 and new.dimension_pool == DEFAULT_DIMENSION_POOL and new.dimension_constraints.k == 5
    retry = openai_stub.chat_requests[1].json["messages"]
    assert retry[2] == {"role": "assistant", "content": bad} and "must match" in retry[3]["content"]


def test_truncated_reply_is_invalid_and_reasked(openai_stub: OpenAIStub) -> None:
    cut = '{"dimension_constraints": {"k": 5, "must_include": ["factual_support"], "weight_min": 0.1, "weight_max": 0.4}}'
    # A reply cut at max_tokens is rejected even when what arrived happens to parse.
    openai_stub.script(Reply(content=cut, finish_reason="length"))
    h, state = llm(openai_stub, max_retries=0, max_tokens=40), make_state()
    assert_failed(h, state, h.update(state, {}), "reply truncated at max_tokens (40)")
    openai_stub.script(Reply(content=cut, finish_reason="length"), GOOD_REPLY)
    h2 = llm(openai_stub, max_retries=1, max_tokens=40)
    assert h2.update(state, {}).dimension_constraints.k == 5 and h2.failures == 0
    note = openai_stub.chat_requests[-1].json["messages"][-1]["content"]
    assert "truncated" in note and "shorter" in note


def test_invalid_json_keeps_state_and_retries_with_feedback(openai_stub: OpenAIStub) -> None:
    openai_stub.content = "I would raise k to five {not json"
    h, state = llm(openai_stub, max_retries=1), make_state()
    assert_failed(h, state, h.update(state, {"consistency": 0.9}), "no JSON object")
    first, second = openai_stub.chat_requests
    assert len(second.json["messages"]) == 4 and "rejected" in second.json["messages"][-1]["content"]
    assert second.json["messages"][2] == {"role": "assistant", "content": "I would raise k to five {not json"}
    h.update(state, {})
    assert h.failures == 2  # failures accumulate across refreshes


@pytest.mark.parametrize("reply,why", [
    (json.dumps({"dimension_constraints": {"weight_min": 0.6, "weight_max": 0.5}}), "weight_min"),
    ('{"dimension_constraints": {"kk": 3}}', "unknown key"),
    ('{"notes": "only notes"}', "none of dimension_constraints"),
    ('{"dimension_constraints": {"must_include": ["made_up"]}}', "unknown dimension"),
])
def test_other_bad_replies(openai_stub: OpenAIStub, reply: str, why: str) -> None:
    openai_stub.content = reply
    h, state = llm(openai_stub, max_retries=0), make_state()
    assert_failed(h, state, h.update(state, {}), why)
    assert len(openai_stub.chat_requests) == 1


def test_sdk_retries_a_500_then_succeeds(openai_stub: OpenAIStub) -> None:
    openai_stub.script(Reply(status=500), GOOD_REPLY)
    h = llm(openai_stub, max_retries=1)
    new = h.update(make_state(version=0), {})
    assert new.version == 1 and new.dimension_constraints.k == 5 and h.failures == 0
    first, second = openai_stub.chat_requests
    assert second.json == first.json  # a transport retry resends the same request, no corrective message
    assert second.header("x-stainless-retry-count") == "1"  # the SDK, not our loop, retried it


def test_http_500_is_retried_then_fails(openai_stub: OpenAIStub) -> None:
    openai_stub.status = 500
    h, state = llm(openai_stub, max_retries=1), make_state()
    assert_failed(h, state, h.update(state, {}), "HTTP 500")
    assert len(openai_stub.chat_requests) == 2  # one try + one SDK retry; no semantic retry on top


def test_http_401_is_not_retried(openai_stub: OpenAIStub) -> None:
    openai_stub.script(Reply(status=401), GOOD_REPLY)
    h, state = llm(openai_stub, max_retries=3), make_state()
    assert_failed(h, state, h.update(state, {}), "HTTP 401")
    assert len(openai_stub.chat_requests) == 1


def test_timeout_keeps_state(openai_stub: OpenAIStub) -> None:
    openai_stub.content, openai_stub.delay_s = GOOD_REPLY, 2.0
    h, state = llm(openai_stub, timeout_s=0.3, max_retries=0), make_state()
    t0 = time.monotonic()
    new = h.update(state, {})
    assert time.monotonic() - t0 < 1.5
    assert_failed(h, state, new, "timeout")


def test_malformed_response_shape(openai_stub: OpenAIStub) -> None:
    openai_stub.script(Reply(body='{"choices": []}'))
    h, state = llm(openai_stub, max_retries=0), make_state()
    assert_failed(h, state, h.update(state, {}), "choices[0].message.content")


def test_connection_refused(caplog) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    h, state = LLMHarness(f"http://127.0.0.1:{port}/v1", "m", max_retries=0, timeout_s=2), make_state()
    with caplog.at_level("WARNING"):
        assert_failed(h, state, h.update(state, {}), "connection error")
    assert "keeping constraints version 3" in caplog.text


def test_harness_pickles_after_use(openai_stub: OpenAIStub) -> None:
    """Spawn-based launchers pickle callbacks; the SDK client is rebuilt on first use after it."""
    openai_stub.content = GOOD_REPLY
    h = llm(openai_stub)
    h.update(make_state(), {})
    clone = pickle.loads(pickle.dumps(h))
    assert clone.update(make_state(), {}).version == 4 and clone.chat.num_requests == 2


def test_extract_json_object_tolerates_think_fences_and_prose() -> None:
    text = '<think>maybe {"k": 1}</think> Sure: {bad} then ```json\n{"a": {"b": [1, 2]}}\n``` and {"c": 3}'
    assert extract_json_object(text) == {"a": {"b": [1, 2]}}
    with pytest.raises(ValueError):
        extract_json_object("[1, 2] no object")
