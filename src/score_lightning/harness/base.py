"""The meta-harness interface: training statistics in, a new set of evaluator constraints out.

SCORE's meta-harness is *fixed* (not trained): every M SCORE steps it reads recent training
statistics and rewrites the constraints the evaluator must respect. Implementations:

* :class:`~score_lightning.harness.rule_based.RuleBasedHarness` - deterministic, offline rules;
* :class:`~score_lightning.harness.llm.LLMHarness` - an external LLM behind an OpenAI-compatible API
  (the paper's setting);
* :class:`StaticHarness` - the "no meta-harness" ablation: the initial constraints never change.

Contract every implementation keeps (the callback and checkpoints rely on it):

* ``update`` never mutates its input ``state``;
* a successful refresh returns a *new*, validated state with ``version = state.version + 1``;
* a failed refresh (LLM backend down, bad reply) returns the previous state unchanged (same
  version), increments ``failures`` and records why in ``last_error``; training never stops
  because the harness is unavailable.
"""

from __future__ import annotations

import math
from typing import Mapping, Protocol, runtime_checkable

from score_lightning.harness.state import HarnessState

#: Statistic keys the harnesses understand; any may be missing (the matching rule is skipped).
STAT_KEYS: tuple[str, ...] = (
    "verified_rate",
    "rubric_valid_rate",
    "consistency",
    "reward_mean",
    "reward_std",
    "answer_valid_rate",
    "tool_calls_mean",
    "entropy",
    "verification_depth_mean",  # evaluator searches per scoring (compare with min_number_of_tool_call)
)


@runtime_checkable
class MetaHarness(Protocol):
    """Anything that turns (state, statistics) into the next state; see the module docstring."""

    failures: int
    last_error: str

    def update(self, state: HarnessState, stats: Mapping[str, float]) -> HarnessState: ...


class StaticHarness:
    """The "harness off" ablation: always returns the given state itself, version unchanged.

    Keeping the version fixed makes the ablation visible in TensorBoard (``harness/version`` stays
    at its initial value) instead of pretending refreshes happened.
    """

    def __init__(self) -> None:
        self.failures = 0
        self.last_error = ""

    def update(self, state: HarnessState, stats: Mapping[str, float]) -> HarnessState:
        return state


def clean_stats(stats: Mapping[str, object]) -> dict[str, float]:
    """Keep only finite numeric statistics, so a NaN (e.g. std of one sample) disables a rule
    instead of silently comparing false against every threshold."""
    out: dict[str, float] = {}
    for key, value in stats.items():
        if isinstance(value, bool):
            continue
        try:
            number = float(value)  # type: ignore[arg-type]  # tensors and numpy scalars too
        except (TypeError, ValueError, RuntimeError):  # RuntimeError: multi-element tensor
            continue
        if math.isfinite(number):
            out[str(key)] = number
    return out
