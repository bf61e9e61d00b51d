"""A schema field: its type (the annotation), its allowed values or range, and why, stated once.

Why no default here: a knob's default and its one-line explanation live beside each other in `configs/`
(the YAML a user reads); the schema states what a value may be. Every field is therefore ``MISSING`` unless
only some options of a group set it (then ``None``, which means "not used by this option"). OmegaConf checks
the type when the YAML merges onto the schema; :func:`field_problems` checks the range and the allowed set.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from omegaconf import MISSING


def knob(*, ge: float | None = None, gt: float | None = None, le: float | None = None, lt: float | None = None,
         choices: Sequence[Any] | None = None, registry: Sequence[str] | None = None, registered: str = "",
         why: str = "", default: Any = MISSING) -> Any:
    """A field with its bounds (``ge``/``gt``/``le``/``lt``) or its allowed set (``choices``), and ``why`` (said in
    the error after what is allowed). ``registry``: a name a registry looks up (a plug-in may add one), with the
    core's own names; the methods declare theirs in their folders (``NAMES``), and ``registered`` says what the
    names are ("solver workflows") in the error."""
    meta = {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt), ("choices", choices),
                              ("registry", registry)) if v is not None}
    if registered:
        meta["registered"] = registered
    if why:
        meta["why"] = why
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: default, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def node(cls: type) -> Any:
    """A nested group node (its values come from the YAML)."""
    return dataclasses.field(default=MISSING, metadata={"node": cls})


def allowed(meta: dict, kind: str = "a number") -> str:
    """What a field's metadata allows, in words ("an integer >= 2", "one of: joint, pointwise")."""
    if "choices" in meta:
        return "one of: " + ", ".join("null" if c is None else str(c) for c in meta["choices"])
    lo = [f"{op} {meta[k]:g}" for k, op in (("ge", ">="), ("gt", ">")) if k in meta]
    hi = [f"{op} {meta[k]:g}" for k, op in (("le", "<="), ("lt", "<")) if k in meta]
    return f"{kind} " + " and ".join(lo + hi)


def value_problem(value: Any, meta: dict, kind: str = "a number") -> str | None:
    """Why ``value`` breaks the field's range or set, or None. ``None`` values pass (the type says if null is allowed)."""
    if value is None or not meta:
        return None
    if "choices" in meta:
        return None if value in meta["choices"] else allowed(meta, kind)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None  # a mixed field (e.g. 'auto' or an integer): its type and the cross-key rules judge it
    ok = (("ge" not in meta or value >= meta["ge"]) and ("gt" not in meta or value > meta["gt"])
          and ("le" not in meta or value <= meta["le"]) and ("lt" not in meta or value < meta["lt"]))
    return None if ok else allowed(meta, kind)


def field_meta(cls: type) -> dict[str, dict]:
    """Each dataclass field's metadata by name."""
    return {f.name: dict(f.metadata) for f in dataclasses.fields(cls)}


