"""The evaluator's rubric Γ = (H, w): its XML form, a forgiving parser and the harness fallback.

The evaluator writes ``<dimensions><dim name="..." weight="..."/>...</dimensions>``. The parser
separates two questions on purpose: *could we read it* (``RubricParse.rubric`` is set) and *does
it satisfy the meta-harness constraints* (``RubricParse.valid``). The trainer needs the first to
log what the evaluator tried and the second to decide whether to fall back to
:func:`fallback_rubric` (and how to reward the attempt).

Block selection: the block ends at the *first* ``</dimensions>`` in the text and starts at the
last ``<dimensions>`` before it. This is the same boundary :func:`rubric_token_span` uses, so the
tokens REINFORCE trains on are exactly the tokens that produced the parsed rubric.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from score_lightning.harness.state import HarnessState
from score_lightning.protocol import DIMENSIONS_CLOSE, DIMENSIONS_OPEN

#: Tolerance on each weight bound (weights are printed with few decimals by models).
WEIGHT_BOUND_TOL = 1e-6
#: Weights must sum to 1 within this tolerance (models rarely hit 1 exactly with 2 decimals).
WEIGHT_SUM_TOL = 0.05

# An attribute value may be double-quoted, single-quoted or (leniently) bare.
ATTR_PATTERN = r"""[A-Za-z_][\w\-]*\s*=\s*(?:"[^"]*"|'[^']*'|[^\s"'<>/=]+)"""
ATTR_RE = re.compile(r"""([A-Za-z_][\w\-]*)\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'<>/=]+))""")
_DIM_START_RE = re.compile(r"<dim(?=[\s/>]|$)")
_DIM_RE = re.compile(rf"<dim((?:\s+{ATTR_PATTERN})*)\s*/?>")


def parse_attributes(attr_text: str) -> dict[str, str]:
    """Attributes of one tag as ``{name: unescaped value}``; the first occurrence of a name wins.

    Shared with the evaluation parser so both accept the same quoting styles.
    """
    out: dict[str, str] = {}
    for m in ATTR_RE.finditer(attr_text):
        name = m.group(1)
        if name not in out:
            value = next(g for g in m.groups()[1:] if g is not None)
            out[name] = html.unescape(value)
    return out


def parse_number(text: str) -> float | None:
    """A finite float from ``text`` (surrounding spaces allowed), else ``None``."""
    try:
        value = float(text.strip())
    except (ValueError, AttributeError):
        return None
    return value if math.isfinite(value) else None


def format_weight(w: float) -> str:
    """Shortest fixed-point text (at least 2 decimals, as in ``0.40``) that parses back to ``w`` exactly.

    Exactness matters: ``parse_rubric(rubric.to_xml())`` must give back the same rubric, so a
    fallback rubric whose weights sum to 1 stays valid after a trip through text.
    """
    for places in range(2, 18):
        s = f"{w:.{places}f}"
        if float(s) == w:
            return s
    return repr(float(w))


@dataclass(frozen=True)
class Rubric:
    """k dimensions (or criteria) and their weights, in the evaluator's order.

    SCORE's rubrics name dimensions of the harness pool, whose definitions the prompts show. Other
    rubric sources (given per-query criteria, evolving RLER items) carry their own ``texts`` (one per
    item, shown instead of a pool definition); their ``dims`` are short ids the evaluator scores by.
    A negative weight is a "penalise this" item. ``binary`` items count as met (1) or not (0).
    """

    dims: tuple[str, ...]
    weights: tuple[float, ...]
    texts: tuple[str, ...] = ()
    binary: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "dims", tuple(str(d) for d in self.dims))
        object.__setattr__(self, "weights", tuple(float(w) for w in self.weights))
        object.__setattr__(self, "texts", tuple(str(t) for t in self.texts))
        if len(self.dims) != len(self.weights):
            raise ValueError(f"Rubric: {len(self.dims)} dims but {len(self.weights)} weights")
        if self.texts and len(self.texts) != len(self.dims):
            raise ValueError(f"Rubric: {len(self.dims)} dims but {len(self.texts)} texts")

    def as_dict(self) -> dict[str, float]:
        return dict(zip(self.dims, self.weights))

    def to_xml(self) -> str:
        """The protocol form; round-trips exactly through :func:`parse_rubric`."""
        body = "".join(
            f'<dim name="{html.escape(d, quote=True)}" weight="{format_weight(w)}"/>'
            for d, w in zip(self.dims, self.weights)
        )
        return f"{DIMENSIONS_OPEN}{body}{DIMENSIONS_CLOSE}"


@dataclass(frozen=True)
class RubricParse:
    """``rubric`` is set whenever the XML could be read; ``valid`` also requires the harness constraints."""

    rubric: Rubric | None
    valid: bool
    error: str


def _fail(error: str, rubric: Rubric | None = None) -> RubricParse:
    return RubricParse(rubric=rubric, valid=False, error=error)


def _read_block(text: str) -> tuple[str | None, str]:
    """Inner text of the first complete ``<dimensions>`` block, or ``(None, reason)``."""
    close = text.find(DIMENSIONS_CLOSE)
    if close < 0:
        return None, (f"missing {DIMENSIONS_CLOSE}" if DIMENSIONS_OPEN in text else f"missing {DIMENSIONS_OPEN}")
    open_ = text.rfind(DIMENSIONS_OPEN, 0, close)
    if open_ < 0:
        return None, f"missing {DIMENSIONS_OPEN} before {DIMENSIONS_CLOSE}"
    return text[open_ + len(DIMENSIONS_OPEN) : close], ""


def _read_rubric(block: str) -> tuple[Rubric | None, str]:
    """Every ``<dim>`` in the block must have a name and a finite numeric weight."""
    matches = list(_DIM_RE.finditer(block))
    if len(matches) != len(_DIM_START_RE.findall(block)):
        return None, "malformed <dim> element"
    if not matches:
        return None, "no <dim> entries"
    dims: list[str] = []
    weights: list[float] = []
    for m in matches:
        attrs = parse_attributes(m.group(1))
        name = attrs.get("name", "").strip()  # data, not config
        if not name:
            return None, "<dim> without name"
        if "weight" not in attrs:
            return None, f"dimension '{name}' has no weight"
        w = parse_number(attrs["weight"])
        if w is None:
            return None, f"weight {attrs['weight']!r} of '{name}' is not a number"
        dims.append(name)
        weights.append(w)
    return Rubric(tuple(dims), tuple(weights)), ""


def check_rubric(rubric: Rubric, state: HarnessState, weight_sum_tol: float | None = WEIGHT_SUM_TOL) -> str:
    """First violated harness constraint as a short reason, or ``""`` when the rubric is valid.

    As the paper's Listing 4 states them: the weight bounds apply to the k - |must_include| dimensions
    the evaluator chose; a must-include dimension (the primary one) is exempt and needs only a weight
    in (0, 1]. The weights must sum to 1 within ``weight_sum_tol`` (``evaluator.rubric_weight_sum_tol``;
    ``None``: any positive total, see :func:`parse_rubric`).
    """
    dc = state.dimension_constraints
    for d in rubric.dims:
        if d not in state.dimension_pool:
            return f"unknown dimension '{d}'"
    seen: set[str] = set()
    for d in rubric.dims:
        if d in seen:
            return f"duplicate dimension '{d}'"
        seen.add(d)
    if len(rubric.dims) != dc.k:
        return f"k={len(rubric.dims)} but harness requires {dc.k}"
    for d in dc.must_include:
        if d not in seen:
            return f"must_include '{d}' missing"
    must = set(dc.must_include)
    for d, w in zip(rubric.dims, rubric.weights):
        if d in must:
            if not 0.0 < w <= 1.0 + WEIGHT_BOUND_TOL:
                return f"weight {w:g} of must-include '{d}' outside (0, 1]"
        elif w > dc.weight_max + WEIGHT_BOUND_TOL:
            return f"weight {w:g} > weight_max {dc.weight_max:g} ('{d}')"
        elif w < dc.weight_min - WEIGHT_BOUND_TOL:
            return f"weight {w:g} < weight_min {dc.weight_min:g} ('{d}')"
    total = math.fsum(rubric.weights)
    if weight_sum_tol is not None and abs(total - 1.0) > weight_sum_tol + 1e-9:
        return f"weights sum to {total:.2f}, need 1±{weight_sum_tol:g}"
    if total <= 0.0:
        return "weights sum to 0"
    return ""


def parse_rubric(text: str, state: HarnessState, weight_sum_tol: float | None = WEIGHT_SUM_TOL) -> RubricParse:
    """Read the first complete ``<dimensions>`` block and check it against ``state``. Never raises.

    With ``weight_sum_tol=None`` the sum is not checked and a valid rubric's weights are divided by
    their total, so R_s = a(r) (1 + sum_j w_j s_j) keeps its scale whatever the evaluator wrote.
    """
    if not isinstance(text, str):
        return _fail("not text")
    block, error = _read_block(text)
    if block is None:
        return _fail(error)
    rubric, error = _read_rubric(block)
    if rubric is None:
        return _fail(error)
    error = check_rubric(rubric, state, weight_sum_tol)
    if not error and weight_sum_tol is None:
        total = math.fsum(rubric.weights)
        rubric = Rubric(rubric.dims, tuple(w / total for w in rubric.weights))
    return RubricParse(rubric=rubric, valid=not error, error=error)


def fallback_rubric(state: HarnessState) -> Rubric:
    """The harness default used when the evaluator's rubric is invalid.

    Dimensions: ``must_include`` first (deduplicated, in order), then pool dimensions in pool
    order until there are k. Weights: equal, clipped into [weight_min, weight_max]. For a valid
    state ``k*weight_min <= 1 <= k*weight_max`` so 1/k already lies in the bounds (up to the
    state's 1e-9 slack); the clip only absorbs that slack and the sum stays within 1e-8 of 1.
    """
    dc = state.dimension_constraints
    dims: list[str] = []
    for d in list(dc.must_include) + list(state.dimension_pool):
        if len(dims) >= dc.k:
            break
        if d not in dims:
            dims.append(d)
    if not dims:
        return Rubric((), ())
    equal = 1.0 / len(dims)
    w = min(max(equal, dc.weight_min), dc.weight_max)
    return Rubric(tuple(dims), tuple(w for _ in dims))


def rubric_token_span(
    token_ids: Sequence[int], decode: Callable[[list[int]], str], close: str = DIMENSIONS_CLOSE
) -> tuple[int, int] | None:
    """``(0, n)`` for the shortest prefix ``token_ids[:n]`` whose decoded text contains ``close``, else ``None``.

    These are the tokens whose log-probability the evaluator's REINFORCE update trains: the
    rubric and whatever the evaluator wrote before it, but nothing after the block closes. The
    boundary is found on decoded text, not on a token id, because real tokenizers split
    ``</dimensions>`` into several BPE pieces (and may merge its first piece with the text before
    it). "Contains" is monotone in the prefix length, so a binary search needs O(log n) decodes.
    """
    ids = [int(t) for t in token_ids]
    if not ids or close not in decode(ids):
        return None
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if close in decode(ids[:mid]):
            hi = mid
        else:
            lo = mid + 1
    return (0, lo)
