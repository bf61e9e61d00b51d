"""The training statistics the meta-harness reads: means of per-step values over its last M steps."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping

#: harness statistic -> the logged step scalar it averages
HARNESS_STATS: dict[str, str] = {
    "verified_rate": "evaluator/verified_rate", "rubric_valid_rate": "evaluator/rubric_valid_rate",
    "consistency": "evaluator/consistency", "reward_mean": "solver/reward_mean", "reward_std": "solver/reward_std",
    "answer_valid_rate": "solver/answer_valid_rate", "tool_calls_mean": "rollout/tool_calls_mean",
    "entropy": "solver/entropy", "verification_depth_mean": "evaluator/verification_depth_mean",
}


class StatsWindow:
    """The last ``size`` steps' statistics; ``size`` is the harness period M (set by its callback)."""

    def __init__(self, size: int) -> None:
        self.steps: deque[dict[str, float]] = deque(maxlen=max(1, int(size)))

    def resize(self, size: int) -> None:
        self.steps = deque(self.steps, maxlen=max(1, int(size)))

    def append(self, step_scalars: Mapping[str, float]) -> None:
        self.steps.append({k: float(step_scalars.get(tag, float("nan"))) for k, tag in HARNESS_STATS.items()})

    def means(self) -> dict[str, float]:
        """Mean of each statistic over the window; non-finite values (nothing measured) are skipped."""
        out: dict[str, float] = {}
        for key in HARNESS_STATS:
            values = [s[key] for s in self.steps if key in s and math.isfinite(s[key])]
            if values:
                out[key] = math.fsum(values) / len(values)
        return out

    def state(self) -> list[dict[str, float]]:
        return list(self.steps)

    def load(self, steps: Iterable[dict[str, float]]) -> None:
        self.steps.clear()
        self.steps.extend(steps)
