"""Faults a run survives, and when it should stop instead: non-finite updates and retrieval outages.

* A non-finite gradient norm skips that optimiser step (weights and optimiser state untouched);
  more than ``optim.max_consecutive_skips`` skips in a row stop the run with a checkpoint.
* Every step's retrievals (solver, scoring and the initial-evidence probe) are counted across ranks;
  ``retriever.max_failed_steps`` consecutive steps in which *every* retrieval failed stop the run.
* A step whose judgements at the ``judge`` endpoint failed more than ``judge.max_failed_rate`` (pooled over ranks)
  stops the run before its update (:func:`check_judgements`).

Counts are reduced over ranks, so every rank takes the same decision at the same step.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import torch

from score_lightning import distributed as D
from score_lightning.clients.judge import JudgeTally
from score_lightning.errors import JudgeUnavailable
from score_lightning.step.types import StepRollouts

log = logging.getLogger(__name__)


def guarded_step(opt, params: list[torch.nn.Parameter], max_norm: float) -> tuple[float, bool]:
    """Clip to ``max_norm`` (0: no clipping), skip on a non-finite norm, else step. Returns (norm, stepped).

    The raw torch optimiser is stepped: Lightning's wrapper would advance ``global_step`` per call,
    and a SCORE step makes several optimiser calls (the module advances it once per step).
    """
    grads = [p for p in params if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(grads, max_norm if max_norm > 0 else float("inf"), foreach=None)
    norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    if math.isfinite(norm):
        opt.optimizer.step() if hasattr(opt, "optimizer") else opt.step()
    opt.zero_grad(set_to_none=True)
    return norm, math.isfinite(norm)


class FaultMonitor:
    """Fault counters of a run (checkpointed) and the decision to halt."""

    def __init__(self, max_consecutive_skips: int, max_failed_steps: int, retriever_name: str) -> None:
        self.max_consecutive_skips, self.max_failed_steps = max_consecutive_skips, max_failed_steps
        self.retriever_name = retriever_name
        self.skipped_steps = self.consecutive_skips = self.worst_consecutive_skips = 0
        self.retrieval_errors_total = self.consecutive_outages = 0

    def record_update(self, stepped: bool, phase: str, score_step: int) -> None:
        if stepped:
            self.consecutive_skips = 0
            return
        self.skipped_steps += 1
        self.consecutive_skips += 1
        log.warning("non-finite gradient norm in %s update at SCORE step %d: update skipped", phase, score_step)

    def record_step(self, ro: StepRollouts) -> float:
        """Count this step's retrievals and failures over all ranks (collective); returns the failures."""
        searches = sum(t.tool_calls - t.invalid_actions for t in ro.solver + ro.scoring) + len(ro.queries)
        errors = sum(t.retrieval_errors for t in ro.solver + ro.scoring) + len(ro.queries) * ro.evidence_errors
        per_rank = D.gather_objects((searches, errors, self.consecutive_skips))
        searches, errors = sum(g[0] for g in per_rank), sum(g[1] for g in per_rank)
        self.worst_consecutive_skips = max(g[2] for g in per_rank)
        self.retrieval_errors_total += errors
        self.consecutive_outages = self.consecutive_outages + 1 if errors >= searches > 0 else 0
        return float(errors)

    def halt_reason(self) -> str | None:
        if self.worst_consecutive_skips > self.max_consecutive_skips:
            return (f"{self.worst_consecutive_skips} consecutive non-finite updates "
                    f"(optim.max_consecutive_skips={self.max_consecutive_skips})")
        if self.consecutive_outages >= self.max_failed_steps:
            return (f"every retrieval failed in {self.consecutive_outages} consecutive steps "
                    f"(retriever.max_failed_steps={self.max_failed_steps}); check {self.retriever_name}")
        return None

    def state_dict(self) -> dict[str, int]:
        return {"skipped_steps": self.skipped_steps, "retrieval_errors_total": self.retrieval_errors_total}

    def load_state_dict(self, state: dict) -> None:
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self.retrieval_errors_total = int(state.get("retrieval_errors_total", 0))


def check_judgements(tally: JudgeTally | None, max_failed_rate: float, checkpoint_dir: str | Path) -> dict[str, float]:
    """The step's judge scalars, pooled over ranks (collective); :class:`JudgeUnavailable` when the failed share
    exceeds ``judge.max_failed_rate`` (before the step's update: the last checkpoint stays the one to resume)."""
    tallies = [t for t in D.gather_objects(tally) if t is not None]
    if not tallies:
        return {}
    pooled = tallies[0]
    for t in tallies[1:]:
        pooled = pooled.merge(t)
    if pooled.requests and pooled.failed_rate > max_failed_rate:
        last = Path(checkpoint_dir) / "last.ckpt"
        resume = (f"the last checkpoint, {last}, is untouched: fix the judge and resume with ckpt_path=last"
                  if last.exists() else "no checkpoint was saved yet: fix the judge and start again")
        raise JudgeUnavailable(
            f"the external judge failed {pooled.failed_rate:.0%} of this step's judgements, above "
            f"judge.max_failed_rate={max_failed_rate:g}: {pooled.describe()}. The step was not trained; {resume}")
    return pooled.metrics()
