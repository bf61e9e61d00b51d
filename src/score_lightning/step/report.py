"""What a step hands to the loggers beyond pooled scalars: its outcome, wall times, global values, distributions
and text."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from score_lightning import distributed as D
from score_lightning.telemetry.loggers import log_histograms, log_texts
from score_lightning.step.evaluator_phase import EvaluatorSignal
from score_lightning.step.reward_assembly import StepRewards
from score_lightning.step.scalars import StepScalars
from score_lightning.step.solver_update import SolverUpdateResult
from score_lightning.step.types import StepRollouts

#: the phases a step's wall time is split into, logged as ``time/<phase>_s``
PHASES = ("rollout", "scoring", "update")


@dataclass
class StepClock:
    """Wall seconds per phase, lap by lap (``rollout.mode=async`` adds the worker's own)."""

    start: float = field(default_factory=time.perf_counter)
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))

    def __post_init__(self) -> None:
        self._lap = self.start

    def lap(self, phase: str | None) -> None:
        """The time since the last lap goes to ``phase`` (``None``: to no phase)."""
        now = time.perf_counter()
        if phase is not None:
            self.seconds[phase] += now - self._lap
        self._lap = now

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] += seconds

    def elapsed(self) -> float:
        return time.perf_counter() - self.start


@dataclass
class StepOutcome:
    """What a finished step hands to the loggers and to ``ScoreModule.last_step`` (tests and drills read it)."""

    rollouts: StepRollouts
    rewards: StepRewards
    solver: SolverUpdateResult | None  # None: solver.freeze
    evaluator: EvaluatorSignal
    scoring: object  # the scoring reward's judgement of the step (``ScoringJudgement``)
    scalars: StepScalars  # this rank's, pooled when the metrics are assembled
    metrics: dict[str, float]  # values already global: rubric statistics, judge, rubric source, updates, objectives
    clock: StepClock


def global_values(ro: StepRollouts, r_eval: float | None, advantage: float | None, module) -> dict[str, float]:
    """Values already identical on every rank: the broadcast rubric, the baseline, counters, the lr."""
    nan = float("nan")
    schedulers = module.lr_schedulers()
    schedulers = list(schedulers) if isinstance(schedulers, (list, tuple)) else ([schedulers] if schedulers else [])
    m = {
        "evaluator/reward": r_eval if r_eval is not None else nan,
        "evaluator/baseline": module.baseline.value,
        "evaluator/advantage": advantage if advantage is not None else nan,
        "evaluator/rubric_valid_rate": float(ro.rubrics.valid),
        "evaluator/fallback_rubric": float(not ro.rubrics.valid),
        "harness/version": float(module.harness_state.version),
        "solver/skipped_steps": float(module.faults.skipped_steps),
        "rollout/retrieval_errors": float(module.faults.retrieval_errors_total),
        "time/weight_sync_s": float(getattr(module, "last_weight_sync_s", 0.0)),
    }
    index = getattr(module, "_optimizer_index", {})  # which optimiser (and scheduler) each phase steps
    for phase in ("solver", "evaluator"):
        i = index.get(phase)
        if i is not None and i < len(schedulers):
            m[f"{phase}/lr"] = float(schedulers[i].get_last_lr()[0])
    if torch.cuda.is_available():
        m["memory/peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30
    m.update({f"dims/{name}_freq": float(f) for name, f in module.scheduler.frequencies().items()})
    return m


def throughput(metrics: dict[str, float]) -> float:
    """Generated tokens of the global batch per second of rollout and scoring."""
    return metrics.get("rollout/generated_tokens", 0.0) / max(metrics["time/rollout_s"] + metrics["time/scoring_s"], 1e-9)


def report_distributions(trainer, ro: StepRollouts, rw: StepRewards, upd: SolverUpdateResult | None, step: int) -> None:
    """Histograms of reward, advantage, response length and tool calls over the global batch (collective)."""
    local = {
        "hist/reward": rw.rewards[rw.rewarded].tolist(),  # a measured reward only: not an unjudged row's zeros
        "hist/advantage": upd.advantages.tolist() if upd is not None else [],
        "hist/response_len": [float(len(t.response_ids)) for t in ro.solver],
        "hist/tool_calls": [float(t.tool_calls) for t in ro.solver],
    }
    gathered = D.gather_objects(local)
    if trainer.is_global_zero:
        merged = {k: [v for g in gathered for v in g[k] if math.isfinite(v)] for k in local}
        log_histograms(trainer.loggers, merged, step)


def report_texts(trainer, texts: dict[str, str], step: int, output_dir: str) -> None:
    """Text samples from rank 0 to every logger that takes text (or ``text_samples.jsonl``)."""
    if trainer.is_global_zero:
        log_texts(trainer.loggers, texts, step, output_dir)
