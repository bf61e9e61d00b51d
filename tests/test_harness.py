"""Meta-harness: rule table, LLM client against a real loopback HTTP server, static ablation."""

from __future__ import annotations

import json
import socket
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openai_stub import OpenAIStub, Reply, openai_stub  # noqa: F401  (fixture)
from score_lightning.harness.base import MetaHarness, StaticHarness
from score_lightning.harness.llm import LLMHarness, extract_json_object
from score_lightning.harness.rule_based import RuleBasedHarness
from score_lightning.harness.state import DEFAULT_DIMENSION_POOL, HarnessState


def make_state(**overrides: object) -> HarnessState:
    """Default state with dotted overrides, e.g. ``k=5, require_verification=False``."""
    dc = {k: v for k, v in overrides.items() if k in ("k", "must_include", "weight_min", "weight_max")}
    pc = {k: v for k, v in overrides.items() if k not in dc and k not in ("pool", "version")}
    data: dict = {"dimension_constraints": dc, "process_constraints": pc, "version": overrides.get("version", 3)}
    if "pool" in overrides:
        data["dimension_pool"] = overrides["pool"]
    return HarnessState.from_dict(data)


def constraints(state: HarnessState) -> dict:
    d = state.to_dict(include_pool=False)
    d.pop("notes"), d.pop("version")
    return d


def apply(stats: dict, harness: RuleBasedHarness | None = None, **state_overrides: object) -> tuple[HarnessState, HarnessState]:
    state = make_state(**state_overrides)
    before = json.dumps(state.to_dict(), sort_keys=True)
    new = (harness or RuleBasedHarness()).update(state, stats)
    assert json.dumps(state.to_dict(), sort_keys=True) == before, "input state was mutated"
    assert new is not state and new.version == state.version + 1
    new.validate()
    assert new.dimension_constraints.must_include == state.dimension_constraints.must_include
    assert new.dimension_pool == state.dimension_pool
    return state, new


# ---------------------------------------------------------------------------- rule-based
def test_protocol_conformance() -> None:
    for h in (RuleBasedHarness(), StaticHarness(), LLMHarness("http://127.0.0.1:1/v1", "m")):
        assert isinstance(h, MetaHarness) and h.failures == 0 and h.last_error == ""


def test_low_verification_raises_tool_calls_and_requires_verification() -> None:
    old, new = apply({"verified_rate": 0.3}, require_verification=False, min_number_of_tool_call=1)
    expected = constraints(old)
    expected["process_constraints"].update(min_number_of_tool_call=2, require_verification=True)
    assert constraints(new) == expected
    assert "verified_rate 0.30 < 0.50" in new.notes


def test_low_verification_tool_calls_capped() -> None:
    _, new = apply({"verified_rate": 0.1}, RuleBasedHarness(max_tool_calls=5), min_number_of_tool_call=5)
    assert new.process_constraints.min_number_of_tool_call == 5
    # a config above the cap is not lowered by a tightening rule
    _, new = apply({"verified_rate": 0.1}, RuleBasedHarness(max_tool_calls=5), min_number_of_tool_call=7)
    assert new.process_constraints.min_number_of_tool_call == 7


@pytest.mark.parametrize("stats", [{"consistency": 0.9}, {"reward_std": 0.01}, {"consistency": 0.95, "reward_std": 0.0}])
def test_saturation_raises_k_and_requires_gap_analysis(stats: dict) -> None:
    old, new = apply(stats, k=4, require_gap_analysis=False)
    expected = constraints(old)
    expected["dimension_constraints"]["k"] = 5
    expected["process_constraints"]["require_gap_analysis"] = True
    assert constraints(new) == expected


def test_saturation_lowers_weight_min_to_keep_weights_feasible() -> None:
    _, new = apply({"consistency": 0.9}, k=4, weight_min=0.25, weight_max=0.5)
    assert (new.dimension_constraints.k, new.dimension_constraints.weight_min) == (5, 0.2)
    _, new = apply({"consistency": 0.9}, k=2, weight_min=0.5, weight_max=0.6)
    assert (new.dimension_constraints.k, new.dimension_constraints.weight_min) == (3, 0.33)


def test_saturation_k_capped_by_max_k_and_pool() -> None:
    _, new = apply({"consistency": 0.9}, RuleBasedHarness(max_k=6), k=6)
    assert new.dimension_constraints.k == 6
    pool = {name: "d" for name in ("factual_support", "readability", "insight")}
    _, new = apply({"consistency": 0.9}, RuleBasedHarness(max_k=6), k=3, pool=pool, weight_min=0.1)
    assert new.dimension_constraints.k == 3
    assert new.process_constraints.require_gap_analysis is True


def test_low_rubric_validity_relaxes_weight_bounds() -> None:
    old, new = apply({"rubric_valid_rate": 0.2}, weight_min=0.1, weight_max=0.5)
    expected = constraints(old)
    expected["dimension_constraints"].update(weight_min=0.05, weight_max=0.6)
    assert constraints(new) == expected
    _, new = apply({"rubric_valid_rate": 0.2}, k=2, weight_min=0.02, weight_max=0.95)
    assert (new.dimension_constraints.weight_min, new.dimension_constraints.weight_max) == (0.0, 1.0)


def test_healthy_stats_ease_back_towards_base_one_notch() -> None:
    healthy = {"verified_rate": 0.9, "consistency": 0.5, "reward_std": 0.2, "rubric_valid_rate": 0.95}
    _, new = apply(healthy, k=6, min_number_of_tool_call=3, weight_min=0.05, weight_max=0.6, require_gap_analysis=True)
    dc, pc = new.dimension_constraints, new.process_constraints
    assert (dc.k, dc.weight_min, dc.weight_max) == (5, 0.1, 0.5)
    assert (pc.min_number_of_tool_call, pc.require_gap_analysis) == (2, True)  # gap analysis stays until k is back
    new2 = RuleBasedHarness().update(new, healthy)
    assert (new2.dimension_constraints.k, new2.process_constraints.require_gap_analysis) == (4, False)
    new3 = RuleBasedHarness().update(new2, healthy)
    assert constraints(new3) == constraints(new2)  # at base: nothing further, never beyond base
    assert new3.process_constraints.min_number_of_tool_call == 1


def test_easing_k_raises_weight_max_when_needed() -> None:
    _, new = apply({"consistency": 0.5}, k=5, weight_min=0.2, weight_max=0.2)
    assert (new.dimension_constraints.k, new.dimension_constraints.weight_max) == (4, 0.25)


def test_hysteresis_band_changes_nothing() -> None:
    between = {"verified_rate": 0.6, "consistency": 0.7, "reward_std": 0.07, "rubric_valid_rate": 0.6}
    old, new = apply(between, k=6, min_number_of_tool_call=3, weight_min=0.05, weight_max=0.6)
    assert constraints(new) == constraints(old)
    assert "no rule fired" in new.notes


def test_missing_and_nan_stats_skip_rules() -> None:
    old, new = apply({"verified_rate": float("nan"), "entropy": 1.0}, k=6, min_number_of_tool_call=3)
    assert constraints(new) == constraints(old)
    assert "verified_rate" in new.notes and "missing" in new.notes


def test_rules_combine() -> None:
    stats = {"verified_rate": 0.2, "consistency": 0.9, "rubric_valid_rate": 0.1}
    _, new = apply(stats, k=4, weight_min=0.25, weight_max=0.3, min_number_of_tool_call=2)
    dc, pc = new.dimension_constraints, new.process_constraints
    assert (dc.k, dc.weight_min, dc.weight_max) == (5, 0.2, 0.4)
    assert (pc.min_number_of_tool_call, pc.require_verification, pc.require_gap_analysis) == (3, True, True)


@st.composite
def valid_states(draw: st.DrawFn) -> HarnessState:
    names = list(DEFAULT_DIMENSION_POOL)
    k = draw(st.integers(1, len(names)))
    wmin_pct = draw(st.integers(0, 100 // k))
    wmin, wmax = wmin_pct / 100, draw(st.integers(max(wmin_pct, -(-100 // k)), 100)) / 100
    must = draw(st.lists(st.sampled_from(names), unique=True, max_size=k))
    return HarnessState.from_dict({
        "dimension_constraints": {"k": k, "must_include": must, "weight_min": wmin, "weight_max": wmax},
        "process_constraints": {"min_number_of_tool_call": draw(st.integers(0, 10)),
                                "require_gap_analysis": draw(st.booleans())},
    })


_rate = st.one_of(st.none(), st.floats(0, 1), st.just(float("nan")))


@settings(max_examples=150, deadline=None)
@given(state=valid_states(), v=_rate, c=_rate, s=_rate, r=_rate)
def test_rule_output_always_validates(state: HarnessState, v, c, s, r) -> None:
    stats = {k: x for k, x in {"verified_rate": v, "consistency": c, "reward_std": s, "rubric_valid_rate": r}.items()
             if x is not None}
    before = state.to_json()
    new = RuleBasedHarness().update(state, stats)
    assert state.to_json() == before
    assert new.validate().version == state.version + 1


def test_static_harness_returns_state_unchanged() -> None:
    state = make_state()
    assert StaticHarness().update(state, {"verified_rate": 0.0}) is state
    assert state.version == 3


# ---------------------------------------------------------------------------- LLM harness
GOOD_REPLY = """Here are the new constraints:
```json
{"dimension_constraints": {"k": 5, "must_include": ["factual_support"], "weight_min": 0.1, "weight_max": 0.4},
 "process_constraints": {"require_gap_analysis": true, "min_number_of_tool_call": 2},
 "notes": "Rubrics saturate; analyse gaps.", "version": 99}
```"""


def llm(stub: OpenAIStub, **kw: object) -> LLMHarness:
    kw.setdefault("retry_backoff_s", 0.0)
    return LLMHarness(stub.base_url, "harness-model", **kw)  # type: ignore[arg-type]


def test_llm_valid_reply_updates_state_and_sends_request(openai_stub: OpenAIStub, monkeypatch) -> None:
    monkeypatch.setenv("HARNESS_KEY", "sk-test-123")
    openai_stub.content = GOOD_REPLY
    h = llm(openai_stub, api_key_env="HARNESS_KEY")
    state = make_state(version=3)
    new = h.update(state, {"verified_rate": 0.4, "consistency": 0.85, "bogus": "x"})
    assert new.version == 4  # bumped by the harness, the reply's "version" is ignored
    assert (new.dimension_constraints.k, new.dimension_constraints.weight_max) == (5, 0.4)
    assert new.process_constraints.require_gap_analysis is True
    assert new.process_constraints.min_number_of_tool_call == 2
    assert new.process_constraints.require_verification is state.process_constraints.require_verification  # from base
    assert new.notes == "Rubrics saturate; analyse gaps."
    assert new.dimension_pool == state.dimension_pool
    assert state.dimension_constraints.k == 4 and state.version == 3  # input untouched
    assert (h.failures, h.last_error) == (0, "")

    (req,) = openai_stub.chat_requests
    assert req.path == "/v1/chat/completions"
    assert req.header("Authorization") == "Bearer sk-test-123"
    assert req.json["model"] == "harness-model" and req.json["temperature"] == 0.0
    roles = [m["role"] for m in req.json["messages"]]
    assert roles == ["system", "user"]
    assert "never choose" in req.json["messages"][0]["content"].lower()
    user = req.json["messages"][1]["content"]
    payload = json.loads(user[user.index("{"): user.rindex("}") + 1])
    assert payload["statistics"] == {"consistency": 0.85, "verified_rate": 0.4}
    assert payload["current_constraints"]["dimension_constraints"]["k"] == 4
    assert payload["dimension_pool"] == list(DEFAULT_DIMENSION_POOL)
    assert "Claims are correct" not in user  # pool definitions are not sent


def test_llm_without_key_sends_no_authorization(openai_stub: OpenAIStub, monkeypatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    openai_stub.content = GOOD_REPLY
    assert llm(openai_stub).update(make_state(), {}).version == 4
    assert openai_stub.chat_requests[0].header("Authorization") is None


def assert_failed(h: LLMHarness, state: HarnessState, new: HarnessState, why: str, failures: int = 1) -> None:
    assert new is state and new.version == state.version
    assert h.failures == failures
    assert why in h.last_error, h.last_error


def test_llm_invalid_json_keeps_state_and_retries_with_feedback(openai_stub: OpenAIStub) -> None:
    openai_stub.content = "I would raise k to five {not json"
    h, state = llm(openai_stub, max_retries=1), make_state()
    assert_failed(h, state, h.update(state, {"consistency": 0.9}), "no JSON object")
    first, second = openai_stub.chat_requests
    assert len(second.json["messages"]) == 4 and "rejected" in second.json["messages"][-1]["content"]
    assert second.json["messages"][2] == {"role": "assistant", "content": "I would raise k to five {not json"}
    h.update(state, {})
    assert h.failures == 2  # failures accumulate across refreshes


def test_llm_schema_violation_keeps_state(openai_stub: OpenAIStub) -> None:
    openai_stub.content = json.dumps({"dimension_constraints": {"weight_min": 0.6, "weight_max": 0.5}})
    h, state = llm(openai_stub, max_retries=0), make_state()
    assert_failed(h, state, h.update(state, {}), "weight_min")
    assert len(openai_stub.chat_requests) == 1


@pytest.mark.parametrize("reply,why", [
    ('{"dimension_constraints": {"kk": 3}}', "unknown key"),
    ('{"notes": "only notes"}', "neither dimension_constraints"),
    ('{"dimension_constraints": {"must_include": ["made_up"]}}', "unknown dimension"),
])
def test_llm_other_bad_replies(openai_stub: OpenAIStub, reply: str, why: str) -> None:
    openai_stub.content = reply
    h, state = llm(openai_stub, max_retries=0), make_state()
    assert_failed(h, state, h.update(state, {}), why)


def test_llm_retry_recovers_from_one_bad_reply(openai_stub: OpenAIStub) -> None:
    openai_stub.script("no json here", GOOD_REPLY)
    h = llm(openai_stub, max_retries=1)
    new = h.update(make_state(version=0), {})
    assert new.version == 1 and new.dimension_constraints.k == 5
    assert h.failures == 0 and len(openai_stub.chat_requests) == 2


def test_llm_timeout_keeps_state(openai_stub: OpenAIStub) -> None:
    openai_stub.content, openai_stub.delay_s = GOOD_REPLY, 2.0
    h, state = llm(openai_stub, timeout_s=0.3, max_retries=0), make_state()
    t0 = time.monotonic()
    new = h.update(state, {})
    assert time.monotonic() - t0 < 1.5
    assert_failed(h, state, new, "timeout")


def test_llm_http_500_is_retried_then_fails(openai_stub: OpenAIStub) -> None:
    openai_stub.status = 500
    h, state = llm(openai_stub, max_retries=1), make_state()
    assert_failed(h, state, h.update(state, {}), "HTTP 500")
    assert len(openai_stub.chat_requests) == 2


def test_llm_http_401_is_not_retried(openai_stub: OpenAIStub) -> None:
    openai_stub.script(Reply(status=401), GOOD_REPLY)
    h, state = llm(openai_stub, max_retries=3), make_state()
    assert_failed(h, state, h.update(state, {}), "HTTP 401")
    assert len(openai_stub.chat_requests) == 1


def test_llm_malformed_response_shape(openai_stub: OpenAIStub) -> None:
    openai_stub.script(Reply(body='{"choices": []}'))
    h, state = llm(openai_stub, max_retries=0), make_state()
    assert_failed(h, state, h.update(state, {}), "choices[0].message.content")


def test_llm_connection_refused(caplog) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    h, state = LLMHarness(f"http://127.0.0.1:{port}/v1", "m", max_retries=0, timeout_s=2), make_state()
    with caplog.at_level("WARNING"):
        assert_failed(h, state, h.update(state, {}), "connection error")
    assert "keeping constraints version 3" in caplog.text


def test_extract_json_object_tolerates_think_fences_and_prose() -> None:
    text = '<think>maybe {"k": 1}</think> Sure: {bad} then ```json\n{"a": {"b": [1, 2]}}\n``` and {"c": 3}'
    assert extract_json_object(text) == {"a": {"b": [1, 2]}}
    with pytest.raises(ValueError):
        extract_json_object("[1, 2] no object")
