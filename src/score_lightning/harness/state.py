"""The meta-harness state: the constraints the evaluator must respect, as validated JSON.

The harness only ever sets *constraints* (how many dimensions, which must be included, weight
bounds, process rules). The concrete dimensions and weights are the evaluator's choice.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

#: The candidate dimension pool: name -> one-line definition (shown to the evaluator).
DEFAULT_DIMENSION_POOL: dict[str, str] = {
    "factual_support": "Claims are correct and backed by the retrieved evidence.",
    "evidence_coverage": "The report uses the relevant evidence the search could find.",
    "citation_grounding": "Every cited source was retrieved and supports the sentence that cites it.",
    "contradiction_handling": "Conflicting evidence is noticed and reconciled rather than ignored.",
    "uncertainty_calibration": "Confidence matches the strength of the evidence; gaps are stated.",
    "discourse_coherence": "The argument flows logically from question to conclusion.",
    "comprehensiveness": "All parts of the question are answered with adequate breadth.",
    "insight": "The report goes beyond restating sources to explain why and how.",
    "instruction_following": "The report answers exactly what the query asks, in the requested form.",
    "readability": "Clear, well organised prose that a practitioner can act on.",
    "conciseness": "No padding or repetition; every sentence carries information.",
    "practical_guidance": "Concrete usage advice, examples or recommendations are given.",
}


class HarnessStateError(ValueError):
    """A harness state (from config, a checkpoint or an LLM reply) violates the schema."""


@dataclass
class DimensionConstraints:
    k: int = 4
    must_include: list[str] = field(default_factory=lambda: ["factual_support"])
    weight_min: float = 0.1
    weight_max: float = 0.5


@dataclass
class ProcessConstraints:
    require_gap_analysis: bool = False
    require_verification: bool = True
    citation_cross_check: bool = False
    min_number_of_tool_call: int = 1


@dataclass
class HarnessState:
    """Constraints for the evaluator; ``version`` counts harness refreshes."""

    dimension_constraints: DimensionConstraints = field(default_factory=DimensionConstraints)
    process_constraints: ProcessConstraints = field(default_factory=ProcessConstraints)
    notes: str = ""
    dimension_pool: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_DIMENSION_POOL))
    version: int = 0

    # ------------------------------------------------------------------ validation
    def validate(self) -> "HarnessState":
        """Raise :class:`HarnessStateError` naming the offending field; return self when valid."""
        dc, pc = self.dimension_constraints, self.process_constraints
        if len(self.dimension_pool) < 2:
            raise HarnessStateError("dimension_pool: needs at least 2 dimensions")
        if not isinstance(dc.k, int) or isinstance(dc.k, bool) or not 1 <= dc.k <= len(self.dimension_pool):
            raise HarnessStateError(
                f"dimension_constraints.k={dc.k!r}: must be an integer in [1, {len(self.dimension_pool)}]"
            )
        unknown = [d for d in dc.must_include if d not in self.dimension_pool]
        if unknown:
            raise HarnessStateError(
                f"dimension_constraints.must_include: unknown dimension(s) {unknown}; "
                f"allowed: {sorted(self.dimension_pool)}"
            )
        if len(dc.must_include) > dc.k:
            raise HarnessStateError(
                f"dimension_constraints.must_include has {len(dc.must_include)} entries but k={dc.k}"
            )
        if not (0.0 <= dc.weight_min <= dc.weight_max <= 1.0):
            raise HarnessStateError(
                f"dimension_constraints: need 0 <= weight_min ({dc.weight_min}) <= weight_max ({dc.weight_max}) <= 1"
            )
        if not (dc.k * dc.weight_min <= 1.0 + 1e-9 <= dc.k * dc.weight_max + 2e-9):
            raise HarnessStateError(
                f"dimension_constraints: weights summing to 1 are impossible with k={dc.k}, "
                f"weight_min={dc.weight_min}, weight_max={dc.weight_max} (need k*min <= 1 <= k*max)"
            )
        if not isinstance(pc.min_number_of_tool_call, int) or not 0 <= pc.min_number_of_tool_call <= 10:
            raise HarnessStateError(
                f"process_constraints.min_number_of_tool_call={pc.min_number_of_tool_call!r}: must be an integer in [0, 10]"
            )
        for name in ("require_gap_analysis", "require_verification", "citation_cross_check"):
            if not isinstance(getattr(pc, name), bool):
                raise HarnessStateError(f"process_constraints.{name}: must be true or false")
        return self

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self, include_pool: bool = True) -> dict[str, Any]:
        d = asdict(self)
        if not include_pool:
            d.pop("dimension_pool")
        return d

    def to_json(self, include_pool: bool = True) -> str:
        return json.dumps(self.to_dict(include_pool=include_pool), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, base: "HarnessState | None" = None) -> "HarnessState":
        """Build and validate a state; keys missing from ``data`` are taken from ``base`` (or defaults).

        Unknown keys are refused so that a typo in a config or an LLM reply is not silently ignored.
        """
        if not isinstance(data, dict):
            raise HarnessStateError(f"harness state must be a JSON object, got {type(data).__name__}")
        base = copy.deepcopy(base) if base is not None else cls()
        allowed = {"dimension_constraints", "process_constraints", "notes", "dimension_pool", "version"}
        extra = set(data) - allowed
        if extra:
            raise HarnessStateError(f"unknown harness state key(s) {sorted(extra)}; allowed: {sorted(allowed)}")
        # data, not config: a partial state (a meta-harness proposal, a checkpoint) keeps ``base``'s other values
        dcs, pcs = data.get("dimension_constraints", {}), data.get("process_constraints", {})  # data, not config
        dc = _merge(base.dimension_constraints, dcs, "dimension_constraints")
        pc = _merge(base.process_constraints, pcs, "process_constraints")
        pool = data.get("dimension_pool", base.dimension_pool)
        if not isinstance(pool, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in pool.items()):
            raise HarnessStateError("dimension_pool: must map dimension names to one-line definitions")
        notes = data.get("notes", base.notes)  # data, not config
        if not isinstance(notes, str):
            raise HarnessStateError("notes: must be a string")
        version = data.get("version", base.version)  # data, not config
        state = cls(dc, pc, notes, dict(pool), int(version))
        return state.validate()

    @classmethod
    def coerce(cls, value: "HarnessState | Mapping[str, Any] | None") -> "HarnessState":
        """A validated copy of ``value``: a state, a mapping in the JSON schema (a plain dict or
        Hydra's ``DictConfig``, e.g. ``${harness.initial_state}``) or ``None`` for the defaults."""
        if value is None:
            return cls().validate()
        if isinstance(value, HarnessState):
            return copy.deepcopy(value).validate()
        if not isinstance(value, Mapping):
            raise HarnessStateError(f"harness state must be a mapping, got {type(value).__name__}")
        return cls.from_dict(to_plain(value))

    @classmethod
    def from_json(cls, text: str, *, base: "HarnessState | None" = None) -> "HarnessState":
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, TypeError) as exc:
            raise HarnessStateError(f"harness state is not valid JSON: {exc}") from exc
        return cls.from_dict(data, base=base)


def to_plain(value: Any) -> Any:
    """Nested mappings and sequences as plain dicts and lists, e.g. Hydra's ``DictConfig`` (which
    resolves interpolations on access) before JSON encoding or ``from_dict``."""
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [to_plain(v) for v in value]
    return value


def _merge(obj: Any, update: Any, prefix: str) -> Any:
    if not isinstance(update, dict):
        raise HarnessStateError(f"{prefix}: must be a JSON object")
    fields = asdict(obj)
    extra = set(update) - set(fields)
    if extra:
        raise HarnessStateError(f"{prefix}: unknown key(s) {sorted(extra)}; allowed: {sorted(fields)}")
    merged = {**fields, **update}
    # Type coercion with explicit checks: JSON numbers for floats, ints for counts, bools for flags.
    for key, default in fields.items():
        value = merged[key]
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise HarnessStateError(f"{prefix}.{key}={value!r}: must be true or false")
        elif isinstance(default, int):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
                raise HarnessStateError(f"{prefix}.{key}={value!r}: must be an integer")
            merged[key] = int(value)
        elif isinstance(default, float):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise HarnessStateError(f"{prefix}.{key}={value!r}: must be a number")
            merged[key] = float(value)
        elif isinstance(default, list):
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise HarnessStateError(f"{prefix}.{key}: must be a list of dimension names")
            merged[key] = list(value)
    return type(obj)(**merged)
