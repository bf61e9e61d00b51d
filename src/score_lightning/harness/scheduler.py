"""Per-dimension statistics that turn evaluator consistency into rubric hints.

After every SCORE step the module calls ``update_stats(rubric_dims, consistencies)`` with the
dimensions of that step's rubric and the per-query consistencies C_i. Each selected dimension keeps
an exponential moving average of the step's mean consistency. From that:

* ``required()`` - dimensions seen often enough whose EMA is high: rubrics using them led to
  reports that agree, i.e. they are reliably reproducible; suggested first, best first;
* ``avoided()`` - dimensions seen often enough whose EMA is low: they tend to go with rubrics the
  solver answers inconsistently; worst first;
* ``explore()`` - dimensions rarely or never chosen, in pool order, so the evaluator does not
  collapse onto a few favourites before the others have any evidence.

Thresholds need ``min_count_required`` observations so a single lucky step cannot promote a
dimension. Only dimensions in the pool are tracked: an unknown name from a malformed rubric is
ignored rather than growing the statistics without bound. When the meta-harness edits the pool,
``set_pool`` keeps the statistics of the dimensions that stay, starts new ones empty and drops
removed ones, so the hints never name a dimension the evaluator may no longer use.
"""

from __future__ import annotations

import math
from typing import Any, Sequence


class DimensionScheduler:
    """EMA statistics per dimension of the pool; plain-python ``state_dict`` for checkpoints."""

    def __init__(
        self,
        pool: Sequence[str],
        ema_decay: float = 0.8,
        min_count_required: int = 3,
        required_threshold: float = 0.6,
        avoid_threshold: float = 0.2,
        explore_below_count: int = 2,
        max_hints: int = 2,
    ) -> None:
        if not 0.0 <= ema_decay < 1.0:
            raise ValueError(f"scheduler.ema_decay={ema_decay}: must be in [0, 1)")
        if avoid_threshold > required_threshold:
            raise ValueError("scheduler: avoid_threshold must not exceed required_threshold")
        if min_count_required < 1 or explore_below_count < 0 or max_hints < 0:
            raise ValueError("scheduler: need min_count_required >= 1, explore_below_count >= 0, max_hints >= 0")
        self.ema_decay = ema_decay
        self.min_count_required = min_count_required
        self.required_threshold = required_threshold
        self.avoid_threshold = avoid_threshold
        self.explore_below_count = explore_below_count
        self.max_hints = max_hints
        self.steps = 0
        self.pool: list[str] = []
        self.count: dict[str, int] = {}  # steps with a consistency observation
        self.selected: dict[str, int] = {}  # steps the dimension was in the rubric
        self.ema: dict[str, float | None] = {}
        self.set_pool(pool)

    def set_pool(self, pool: Sequence[str]) -> None:
        """Follow a pool edit: kept dimensions keep their statistics (in the new pool order), new
        ones start empty, removed ones are dropped. ``steps`` is unchanged, so a new dimension's
        frequency counts from the steps it could not yet be chosen (it starts at 0, like any unused one)."""
        names = list(dict.fromkeys(pool))  # de-duplicate, keep order
        if not names:
            raise ValueError("scheduler: pool must name at least one dimension")
        self.pool = names
        self.count = {d: self.count.get(d, 0) for d in names}
        self.selected = {d: self.selected.get(d, 0) for d in names}
        self.ema = {d: self.ema.get(d) for d in names}

    # ------------------------------------------------------------------ updates
    def update_stats(self, rubric_dims: Sequence[str], consistencies: Sequence[float]) -> None:
        """Record one SCORE step: the rubric's dimensions and that step's per-query consistencies.

        Non-finite consistencies are dropped; with none left the selection still counts for
        ``frequencies()`` but no EMA moves (there is nothing to average).
        """
        values = [float(c) for c in consistencies if math.isfinite(float(c))]
        mean = sum(values) / len(values) if values else None
        self.steps += 1
        for dim in dict.fromkeys(rubric_dims):
            if dim not in self.count:
                continue
            self.selected[dim] += 1
            if mean is None:
                continue
            self.count[dim] += 1
            prev = self.ema[dim]
            self.ema[dim] = mean if prev is None else self.ema_decay * prev + (1.0 - self.ema_decay) * mean

    # ------------------------------------------------------------------ hints
    def required(self) -> list[str]:
        """Reliably reproducible dimensions (enough observations, EMA >= threshold), best first."""
        ok = [d for d in self.pool if self._seen(d) and self.ema[d] >= self.required_threshold]  # type: ignore[operator]
        ok.sort(key=lambda d: -self.ema[d])  # type: ignore[operator]  # stable: ties keep pool order
        return ok[: self.max_hints]

    def avoided(self) -> list[str]:
        """Dimensions with enough observations and EMA <= avoid threshold, worst first."""
        bad = [d for d in self.pool if self._seen(d) and self.ema[d] <= self.avoid_threshold]  # type: ignore[operator]
        bad.sort(key=lambda d: self.ema[d])  # type: ignore[arg-type,return-value]
        return bad

    def explore(self) -> list[str]:
        """Rarely selected dimensions (count < explore_below_count), in pool order."""
        return [d for d in self.pool if self.count[d] < self.explore_below_count][: self.max_hints]

    def frequencies(self) -> dict[str, float]:
        """Share of steps each dimension was selected (logged as ``dims/<name>_freq``)."""
        return {d: (self.selected[d] / self.steps if self.steps else 0.0) for d in self.pool}

    def _seen(self, dim: str) -> bool:
        return self.count[dim] >= self.min_count_required and self.ema[dim] is not None

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable statistics (hyperparameters come from the config, not the checkpoint)."""
        return {
            "pool": list(self.pool),
            "steps": self.steps,
            "count": dict(self.count),
            "selected": dict(self.selected),
            "ema": dict(self.ema),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore statistics. Dimensions no longer in the pool are dropped; new ones start empty,
        so a pool edited between runs resumes instead of failing."""
        self.steps = int(state["steps"])
        self.count = {d: int(state["count"].get(d, 0)) for d in self.pool}
        self.selected = {d: int(state.get("selected", state["count"]).get(d, 0)) for d in self.pool}
        ema = state["ema"]
        self.ema = {d: (None if ema.get(d) is None else float(ema[d])) for d in self.pool}
