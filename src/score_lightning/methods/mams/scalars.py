"""What MaMs trajectories add to a step's scalars (``solver.agent=mams``), registered in ``step.record.ROLLOUT_SCALARS``."""

from __future__ import annotations

from score_lightning.step.record import ROLLOUT_SCALARS
from score_lightning.step.scalars import StepScalars


def record_mams(sc: StepScalars, solver: list) -> None:
    """MaMs: turns per trajectory, memory length per state update, and the longest role prompt (a max)."""
    memory = [n for t in solver for n in t.meta.get("memory_tokens", [])]  # data, not config
    sc.mean("rollout/mams_turns_mean", float(sum(t.meta.get("turns", 0) for t in solver)), len(solver))
    sc.mean("rollout/memory_tokens_mean", float(sum(memory)), len(memory))
    sc.max("rollout/context_tokens_max", float(max(t.meta.get("context_max", 0) for t in solver)))


ROLLOUT_SCALARS.register("mams", record_mams)
