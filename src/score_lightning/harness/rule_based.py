"""A deterministic, offline meta-harness: documented rules from training statistics to constraints.

The paper uses an external LLM as the meta-harness. These rules encode the same intent without a
network dependency (CPU runs, CI, ablations with a reproducible harness). Each rule reads one
statistic; a missing or non-finite statistic skips the rule (it neither tightens nor eases).

Every rule tightens away from, and relaxes back towards, the *base state*: the configured
``harness.initial_state`` (``base_state``; the ``HarnessState`` defaults when none is given). A
healthy run therefore keeps exactly the configured constraints; "base" below means that state.

| rule | condition (defaults) | change |
| --- | --- | --- |
| verification | ``verified_rate < low_verified`` (0.5) | ``min_number_of_tool_call += 1`` (at most ``max_tool_calls``), ``require_verification = True`` |
| verification eases | ``verified_rate >= recover_verified`` (0.8) | ``min_number_of_tool_call`` one step towards base; once there, ``require_verification`` returns to base |
| saturation | ``consistency > high_consistency`` (0.8) or ``reward_std < high_reward_std_floor`` (0.05) | ``k += 1`` (at most ``min(max_k, pool size)``), ``require_gap_analysis = True`` |
| saturation eases | every present one of ``consistency <= recover_consistency`` (0.6), ``reward_std >= recover_reward_std`` (0.1) | ``k`` one step towards base; once there, ``require_gap_analysis`` returns to base |
| rubric validity | ``rubric_valid_rate < low_rubric_valid`` (0.5) | ``weight_min = max(0, weight_min - 0.05)``, ``weight_max = min(1, weight_max + 0.1)`` |
| rubric validity eases | ``rubric_valid_rate >= recover_rubric_valid`` (0.8) | ``weight_min`` one step (0.05) and ``weight_max`` one step (0.1) towards base |
| feasibility (always) | ``k * weight_min > 1`` or ``k * weight_max < 1`` | ``weight_min`` down to ``floor(100/k)/100``, ``weight_max`` up to ``ceil(100/k)/100`` |

Why these directions: low verification means the evaluator scores without checking, so the
verifier zeroes its rewards - more required tool calls ask it, in the scoring prompt, to search.
That minimum is a prompt rule: tau_s stays ``verifier.min_search_depth`` unless
``verifier.tau_from_harness=true`` (raising tau_s with it would lower ``verified_rate`` further and
ratchet the minimum to its cap, ``max_tool_calls``: ``evaluator.max_tool_calls`` in ``configs/harness/rule.yaml``). Saturation (high
consistency, or rewards that no longer separate the K reports) means the rubric has stopped being
informative - more dimensions and an explicit gap analysis make it discriminate again. Invalid
rubrics usually fail the weight bounds, so the bounds are relaxed until the evaluator can comply.
The "eases" rows use separate, stricter thresholds (hysteresis) so a statistic hovering near a
trigger does not make the constraints oscillate every refresh; they move one step per refresh
towards the base and never past it. (A value on the other side of base, e.g. from a checkpoint
of a run configured differently, is also brought back to the configured base.)

``verification_depth_mean`` is not used: ``verified_rate`` already measures the share of scorings
that searched at least ``verifier.min_search_depth`` times, which is what the verifier acts on.

The harness never chooses concrete dimensions or weights: ``must_include`` and the pool are kept
as they are. Every output validates (``HarnessState.validate``), and ``notes`` says which rules fired.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Mapping

from score_lightning.harness.base import clean_stats
from score_lightning.harness.state import HarnessState


def _r(x: float) -> float:
    """Round away binary noise (0.1 - 0.05 = 0.05000000000000001) so configs and tests read cleanly."""
    return round(x, 6)


def _toward(value: float, base: float, step: float) -> float:
    """``value`` moved by at most ``step`` towards ``base``, never past it."""
    if value > base:
        return max(base, value - step)
    return min(base, value + step)


@dataclass
class _Work:
    """Mutable working copy of the constraints the rules touch."""

    k: int
    weight_min: float
    weight_max: float
    min_tool_calls: int
    require_verification: bool
    require_gap_analysis: bool


class RuleBasedHarness:
    """Deterministic meta-harness; see the module docstring for the rule table."""

    def __init__(
        self,
        base_state: HarnessState | Mapping[str, Any] | None = None,
        low_verified: float = 0.5,
        high_consistency: float = 0.8,
        high_reward_std_floor: float = 0.05,
        low_rubric_valid: float = 0.5,
        max_k: int = 6,
        max_tool_calls: int = 5,
        recover_verified: float = 0.8,
        recover_consistency: float = 0.6,
        recover_reward_std: float = 0.1,
        recover_rubric_valid: float = 0.8,
        weight_min_step: float = 0.05,
        weight_max_step: float = 0.1,
    ) -> None:
        """``base_state``: the configured initial state (a ``HarnessState`` or a mapping in its JSON
        schema, e.g. Hydra's ``${harness.initial_state}``) that every easing rule returns to."""
        if recover_verified < low_verified or recover_rubric_valid < low_rubric_valid:
            raise ValueError("harness: recover_* thresholds must not be below the matching low_* trigger")
        if recover_consistency > high_consistency or recover_reward_std < high_reward_std_floor:
            raise ValueError("harness: recover_consistency <= high_consistency and recover_reward_std >= floor required")
        if max_k < 1 or not 0 <= max_tool_calls <= 10:
            raise ValueError("harness: need max_k >= 1 and 0 <= max_tool_calls <= 10")
        self.low_verified = low_verified
        self.high_consistency = high_consistency
        self.high_reward_std_floor = high_reward_std_floor
        self.low_rubric_valid = low_rubric_valid
        self.max_k = max_k
        self.max_tool_calls = max_tool_calls
        self.recover_verified = recover_verified
        self.recover_consistency = recover_consistency
        self.recover_reward_std = recover_reward_std
        self.recover_rubric_valid = recover_rubric_valid
        self.weight_min_step = weight_min_step
        self.weight_max_step = weight_max_step
        base = HarnessState.coerce(base_state)
        dc, pc = base.dimension_constraints, base.process_constraints
        self.base_state = base
        self.base_k = dc.k
        self.base_weight_min = dc.weight_min
        self.base_weight_max = dc.weight_max
        self.base_min_tool_calls = pc.min_number_of_tool_call
        self.base_require_verification = pc.require_verification
        self.base_require_gap_analysis = pc.require_gap_analysis
        self.failures = 0  # rules cannot fail; kept for the MetaHarness protocol
        self.last_error = ""

    # ------------------------------------------------------------------ public API
    def update(self, state: HarnessState, stats: Mapping[str, float]) -> HarnessState:
        """Apply every rule whose statistic is present; return a new validated state (version + 1)."""
        s = clean_stats(stats)
        dc, pc = state.dimension_constraints, state.process_constraints
        w = _Work(dc.k, dc.weight_min, dc.weight_max, pc.min_number_of_tool_call,
                  pc.require_verification, pc.require_gap_analysis)
        pool_size = len(state.dimension_pool)
        k_cap = max(dc.k, min(self.max_k, pool_size))  # a cap never shrinks k
        k_base = min(max(self.base_k, len(dc.must_include)), pool_size)  # the base k this pool allows
        notes: list[str] = []
        self._verification(s, w, notes)
        self._saturation(s, w, k_cap, k_base, notes)
        self._rubric_validity(s, w, notes)
        self._feasibility(w, len(dc.must_include), len(state.dimension_pool), notes)
        if not notes:
            notes.append("no rule fired; constraints unchanged")
        # Name only rules skipped entirely (saturation needs either consistency or reward_std).
        missing = [key for key in ("verified_rate", "rubric_valid_rate") if key not in s]
        if "consistency" not in s and "reward_std" not in s:
            missing.insert(1, "consistency/reward_std")
        if missing:
            notes.append(f"statistics missing (rules skipped): {', '.join(missing)}")

        new = copy.deepcopy(state)
        new.dimension_constraints.k = w.k
        new.dimension_constraints.weight_min = w.weight_min
        new.dimension_constraints.weight_max = w.weight_max
        new.process_constraints.min_number_of_tool_call = w.min_tool_calls
        new.process_constraints.require_verification = w.require_verification
        new.process_constraints.require_gap_analysis = w.require_gap_analysis
        new.notes = f"rule-based harness v{state.version + 1}: " + "; ".join(notes) + "."
        new.version = state.version + 1
        return new.validate()

    # ------------------------------------------------------------------ rules
    def _verification(self, s: dict[str, float], w: _Work, notes: list[str]) -> None:
        rate = s.get("verified_rate")
        if rate is None:
            return
        if rate < self.low_verified:
            before = w.min_tool_calls
            w.min_tool_calls = max(before, min(self.max_tool_calls, before + 1))
            w.require_verification = True
            notes.append(
                f"verified_rate {rate:.2f} < {self.low_verified:.2f}: verify claims by search, "
                f"min_number_of_tool_call {before}->{w.min_tool_calls}"
            )
        elif rate >= self.recover_verified:
            if w.min_tool_calls != self.base_min_tool_calls:
                before = w.min_tool_calls
                w.min_tool_calls = int(_toward(before, self.base_min_tool_calls, 1))
                notes.append(f"verified_rate {rate:.2f} recovered: min_number_of_tool_call {before}->{w.min_tool_calls}")
            if w.min_tool_calls == self.base_min_tool_calls and w.require_verification != self.base_require_verification:
                w.require_verification = self.base_require_verification
                notes.append(f"require_verification back to {str(self.base_require_verification).lower()}")

    def _saturation(self, s: dict[str, float], w: _Work, k_cap: int, k_base: int, notes: list[str]) -> None:
        cons, std = s.get("consistency"), s.get("reward_std")
        if cons is None and std is None:
            return
        reasons = []
        if cons is not None and cons > self.high_consistency:
            reasons.append(f"consistency {cons:.2f} > {self.high_consistency:.2f}")
        if std is not None and std < self.high_reward_std_floor:
            reasons.append(f"reward_std {std:.3f} < {self.high_reward_std_floor:.3f}")
        if reasons:
            before = w.k
            w.k = min(before + 1, k_cap) if before < k_cap else before
            w.require_gap_analysis = True
            notes.append(f"{' and '.join(reasons)} (saturated): k {before}->{w.k}, require gap analysis")
            return
        healthy = (cons is None or cons <= self.recover_consistency) and (
            std is None or std >= self.recover_reward_std
        )
        if not healthy:
            return
        if w.k != k_base:
            before = w.k
            w.k = int(_toward(before, k_base, 1))
            notes.append(f"rewards discriminate again: k {before}->{w.k}")
        if w.k == k_base and w.require_gap_analysis != self.base_require_gap_analysis:
            w.require_gap_analysis = self.base_require_gap_analysis
            notes.append(f"require_gap_analysis back to {str(self.base_require_gap_analysis).lower()}")

    def _rubric_validity(self, s: dict[str, float], w: _Work, notes: list[str]) -> None:
        rate = s.get("rubric_valid_rate")
        if rate is None:
            return
        before = (w.weight_min, w.weight_max)
        if rate < self.low_rubric_valid:
            w.weight_min = _r(max(0.0, w.weight_min - self.weight_min_step))
            w.weight_max = _r(min(1.0, w.weight_max + self.weight_max_step))
            notes.append(
                f"rubric_valid_rate {rate:.2f} < {self.low_rubric_valid:.2f}: relax weight bounds "
                f"[{before[0]:g}, {before[1]:g}] -> [{w.weight_min:g}, {w.weight_max:g}]"
            )
        elif rate >= self.recover_rubric_valid:
            w.weight_min = _r(_toward(w.weight_min, self.base_weight_min, self.weight_min_step))
            w.weight_max = _r(_toward(w.weight_max, self.base_weight_max, self.weight_max_step))
            if (w.weight_min, w.weight_max) != before:
                notes.append(
                    f"rubric_valid_rate {rate:.2f} recovered: weight bounds "
                    f"[{before[0]:g}, {before[1]:g}] -> [{w.weight_min:g}, {w.weight_max:g}]"
                )

    @staticmethod
    def _feasibility(w: _Work, n_must: int, pool_size: int, notes: list[str]) -> None:
        """Keep ``k * weight_min <= 1 <= k * weight_max`` so weights summing to one exist."""
        w.k = max(w.k, n_must, 1)
        w.k = min(w.k, pool_size)
        if w.k * w.weight_min > 1.0 + 1e-9:
            before = w.weight_min
            w.weight_min = _r(math.floor(100.0 / w.k + 1e-9) / 100.0)
            notes.append(f"weight_min {before:g}->{w.weight_min:g} so {w.k} weights can sum to 1")
        if w.k * w.weight_max < 1.0 - 1e-9:
            before = w.weight_max
            w.weight_max = _r(math.ceil(100.0 / w.k - 1e-9) / 100.0)
            notes.append(f"weight_max {before:g}->{w.weight_max:g} so {w.k} weights can sum to 1")
        if w.weight_min > w.weight_max:
            w.weight_min = w.weight_max
