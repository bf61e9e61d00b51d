"""Meta-harness: the rule table, relaxing back to the configured base state, the static ablation.

The LLM harness (against a real loopback HTTP server) is in ``test_harness_llm.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from score_lightning.harness.base import STAT_KEYS, MetaHarness, StaticHarness
from score_lightning.harness.llm import LLMHarness
from score_lightning.harness.rule_based import RuleBasedHarness
from score_lightning.harness.state import DEFAULT_DIMENSION_POOL, HarnessState, HarnessStateError

RULE_YAML = Path(__file__).resolve().parents[1] / "configs" / "harness" / "rule.yaml"


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


# ---------------------------------------------------------------------------- configured base state
#: What configs/harness/rule.yaml configures; the test below checks the file still says so.
CONFIGURED = {
    "dimension_constraints": {"k": 3, "must_include": ["factual_support"], "weight_min": 0.1, "weight_max": 0.6},
    "process_constraints": {"require_gap_analysis": False, "require_verification": False,
                            "citation_cross_check": False, "min_number_of_tool_call": 1},
    "notes": "",
}
HEALTHY = {"verified_rate": 0.9, "consistency": 0.5, "reward_std": 0.2, "rubric_valid_rate": 0.9,
           "answer_valid_rate": 0.8}


@pytest.fixture
def configured() -> tuple[RuleBasedHarness, HarnessState]:
    """The harness built as Hydra builds it (base_state = ${harness.initial_state}, a DictConfig)."""
    initial_state = OmegaConf.load(RULE_YAML).initial_state
    assert OmegaConf.to_container(initial_state) == CONFIGURED
    return RuleBasedHarness(base_state=initial_state), HarnessState.from_dict(dict(CONFIGURED))


def refresh(harness: RuleBasedHarness, state: HarnessState, stats: dict, times: int = 1) -> HarnessState:
    for _ in range(times):
        state = harness.update(state, stats)
    return state


def test_configured_state_is_a_fixed_point_under_healthy_stats(configured) -> None:
    harness, state = configured
    new = refresh(harness, state, HEALTHY, times=4)
    assert constraints(new) == constraints(state)  # not drifting to the dataclass defaults (k=4, 0.5)
    assert new.version == state.version + 4 and "no rule fired" in new.notes
    assert new.dimension_pool == state.dimension_pool


def test_saturation_then_recovery_returns_k_to_configured_base(configured) -> None:
    harness, state = configured
    saturated = refresh(harness, state, {**HEALTHY, "consistency": 0.9})
    assert saturated.dimension_constraints.k == 4 and saturated.process_constraints.require_gap_analysis
    recovered = refresh(harness, saturated, HEALTHY)
    assert constraints(recovered) == constraints(state)  # k 4 -> 3, gap analysis back to false
    assert "k 4->3" in recovered.notes


def test_low_verification_then_recovery_returns_to_configured_base(configured) -> None:
    harness, state = configured
    tight = refresh(harness, state, {**HEALTHY, "verified_rate": 0.2}, times=2)
    assert (tight.process_constraints.min_number_of_tool_call, tight.process_constraints.require_verification) == (3, True)
    one = refresh(harness, tight, HEALTHY)
    # one notch per refresh; verification stays required until the tool-call floor is back at base
    assert (one.process_constraints.min_number_of_tool_call, one.process_constraints.require_verification) == (2, True)
    back = refresh(harness, one, HEALTHY)
    assert constraints(back) == constraints(state)
    assert "require_verification back to false" in back.notes


def test_relaxed_weight_bounds_return_to_configured_not_default(configured) -> None:
    harness, state = configured
    loose = refresh(harness, state, {**HEALTHY, "rubric_valid_rate": 0.1})
    assert (loose.dimension_constraints.weight_min, loose.dimension_constraints.weight_max) == (0.05, 0.7)
    back = refresh(harness, loose, HEALTHY, times=3)
    assert (back.dimension_constraints.weight_min, back.dimension_constraints.weight_max) == (0.1, 0.6)


def test_state_on_the_other_side_of_base_is_brought_back(configured) -> None:
    """E.g. a checkpoint of a run configured differently: healthy statistics lead to the configured base."""
    harness, _ = configured
    state = make_state(k=2, weight_min=0.3, weight_max=0.5, min_number_of_tool_call=0, require_verification=True)
    new = refresh(harness, state, HEALTHY, times=4)  # weight_min 0.3 -> 0.1 takes four 0.05 steps
    dc, pc = new.dimension_constraints, new.process_constraints
    assert (dc.k, dc.weight_min, dc.weight_max, pc.min_number_of_tool_call) == (3, 0.1, 0.6, 1)
    assert pc.require_verification is False


def test_base_state_forms_and_validation() -> None:
    as_state = RuleBasedHarness(base_state=HarnessState.from_dict(dict(CONFIGURED)))
    as_dict = RuleBasedHarness(base_state=CONFIGURED)
    assert (as_state.base_k, as_state.base_weight_max) == (as_dict.base_k, as_dict.base_weight_max) == (3, 0.6)
    default = RuleBasedHarness()
    assert (default.base_k, default.base_weight_max, default.base_require_verification) == (4, 0.5, True)
    with pytest.raises(HarnessStateError, match="weight_min"):
        RuleBasedHarness(base_state={"dimension_constraints": {"weight_min": 0.7, "weight_max": 0.6}})
    with pytest.raises(HarnessStateError, match="mapping"):
        RuleBasedHarness(base_state=["k", 3])  # type: ignore[arg-type]


def test_base_k_is_capped_by_a_smaller_pool() -> None:
    """Easing never asks for more dimensions than the pool has (the note would lie otherwise)."""
    pool = {name: "d" for name in ("factual_support", "readability")}
    harness = RuleBasedHarness(base_state={"dimension_constraints": {"k": 4}})
    _, new = apply(HEALTHY, harness, k=1, pool=pool, weight_max=1.0)
    assert new.dimension_constraints.k == 2 and "k 1->2" in new.notes


def test_stat_keys_name_what_the_harness_reads() -> None:
    assert {"verified_rate", "consistency", "reward_std", "rubric_valid_rate", "entropy",
            "verification_depth_mean"} <= set(STAT_KEYS)


# ---------------------------------------------------------------------------- tau_s and the harness
@pytest.mark.parametrize("coupled", [False, True])
def test_unverified_scoring_for_20_refreshes_keeps_tau_fixed_and_the_minimum_within_its_cap(coupled) -> None:
    """An evaluator that never searches (verified_rate 0 at every refresh): the harness asks for more
    searches up to its cap; by default tau_s stays verifier.min_search_depth, coupled it follows the
    harness to the cap (the ratchet ``verifier.tau_from_harness`` documents)."""
    from hydra.utils import instantiate

    from helpers import compose
    from score_lightning.step.reward_assembly import verifier_tau

    cfg = compose(["experiment=tiny_score", f"verifier.tau_from_harness={str(coupled).lower()}"])
    harness = instantiate(cfg.harness.backend)
    cap = int(cfg.evaluator.max_tool_calls)
    assert harness.max_tool_calls == cap  # the config ties the harness's cap to the evaluator's search budget
    state = HarnessState.from_dict(OmegaConf.to_container(cfg.harness.initial_state, resolve=True))
    taus, minimums = [], []
    for _ in range(20):
        state = harness.update(state, {**HEALTHY, "verified_rate": 0.0})
        taus.append(verifier_tau(cfg.verifier, state))
        minimums.append(state.process_constraints.min_number_of_tool_call)
    assert max(minimums) == cap and all(0 <= m <= cap for m in minimums)
    assert state.process_constraints.require_verification
    if coupled:
        assert taus[-1] == cap > cfg.verifier.min_search_depth
    else:
        assert set(taus) == {cfg.verifier.min_search_depth}
