"""What leaves a SCORE step's process: its scalars to the loggers, a halt with its checkpoint, the console line, the
text samples, the export."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from omegaconf import OmegaConf

from score_lightning.errors import TrainingHalted
from score_lightning.glue.environment import write_environment
from score_lightning.step.report import (
    PHASES, StepOutcome, global_values, report_distributions, report_texts, throughput,
)
from score_lightning.step.samples import step_samples

log = logging.getLogger("score_lightning.module")


class OutputHooks:
    """Logging, halting and export of :class:`~score_lightning.module.ScoreModule`."""

    def step_metrics(self, outcome: StepOutcome) -> dict[str, float]:
        """Every scalar of the finished step, pooled over ranks (collective); the step is kept in ``last_step`` and
        its metrics in the harness's window."""
        ro, sc, metrics = outcome.rollouts, outcome.scalars, dict(outcome.metrics)
        for phase in PHASES:  # async: the rollout and scoring times include the worker's
            sc.max(f"time/{phase}_s", outcome.clock.seconds[phase])
        metrics["rollout/retrieval_errors_step"] = self.faults.record_step(ro)
        metrics.update(sc.compute())
        metrics.update(global_values(ro, outcome.evaluator.mean_reward, outcome.evaluator.mean_advantage, self))
        metrics["throughput/tokens_per_s"] = throughput(metrics)
        report_distributions(self.trainer, ro, outcome.rewards, outcome.solver, self.score_step)
        self.last_step = {"rollouts": ro, "rewards": outcome.rewards, "solver": outcome.solver,
                          "evaluator_reward": outcome.evaluator.mean_reward,
                          "evaluator_advantage": outcome.evaluator.mean_advantage,
                          "sample_rewards": outcome.evaluator.rewards, "scoring": outcome.scoring, "metrics": metrics}
        self.stats_window.append(metrics)
        return metrics

    def log_step(self, outcome: StepOutcome, metrics: dict[str, float]) -> None:
        """The step just counted (``score_step`` already advanced): to the loggers, a halt when a fault stops the run,
        the console line, and every ``logging.text_every_n_steps`` steps its text samples."""
        self.log_step_metrics(metrics)
        reason = self.faults.halt_reason()
        if reason is not None:
            self.halt(metrics, reason)
        ro, rw = outcome.rollouts, outcome.rewards
        if self.global_rank == 0:  # one line per step, not one per rank
            log.info("SCORE step %d done: reward=%.3f valid=%.2f rubric_valid=%d consistency=%.3f tool_calls=%.2f "
                     "(%.1fs)",
                     self.score_step - 1, metrics["solver/reward_mean"], metrics["solver/answer_valid_rate"],
                     int(ro.rubrics.valid), outcome.evaluator.consistency, metrics["rollout/tool_calls_mean"],
                     outcome.clock.elapsed())
        every = int(self.cfg.logging.text_every_n_steps)
        if every > 0 and (every == 1 or self.score_step % every == 1):
            report_texts(self.trainer, step_samples(ro, rw, self.harness_state, self.tokenizer), self.score_step - 1,
                         str(self.cfg.paths.output_dir))

    def on_train_batch_start(self, batch: dict, batch_idx: int) -> None:
        forget_last_step(self.trainer)

    def log_step_metrics(self, metrics: dict[str, float]) -> None:
        # Every value is already reduced over ranks (StepScalars) or identical on all of them, so no
        # sync_dist here; logger=True uses global_step, which equals score_step (advance_global_step).
        clean = finite(metrics)
        self.log_dict(clean, on_step=True, on_epoch=False, prog_bar=False, logger=True, batch_size=1, sync_dist=False)
        self.log("score_step", float(self.score_step), prog_bar=True, logger=False, batch_size=1)
        self.log("reward", clean.get("solver/reward_mean", 0.0), prog_bar=True, logger=False, batch_size=1)

    def halt(self, metrics: dict[str, float], reason: str) -> None:
        """Write ``last.ckpt`` for the finished step (atomic) and stop with :class:`TrainingHalted`."""
        if self.logger is not None and self.global_rank == 0:
            # self.log() would only flush after training_step returns, which it will not
            self.logger.log_metrics(finite(metrics), step=self.score_step - 1)
            self.logger.save()
        path = Path(self.cfg.callbacks.model_checkpoint.dirpath) / "last.ckpt"
        self.trainer.save_checkpoint(str(path), weights_only=False)  # the full state: a halted run resumes from it
        log.error("training stopped: %s; checkpoint saved to %s", reason, path)
        raise TrainingHalted(f"training stopped: {reason}; checkpoint saved to {path}")

    def export_policy(self, out_dir: str | Path) -> Path:
        """``save_pretrained`` of the policy (LoRA merged, adapter in ``adapter/``) plus tokenizer; collective under FSDP."""
        from score_lightning.policy.export import save_policy

        out = Path(out_dir)
        save_policy(self.policy, out, write=self.global_rank == 0)
        if self.global_rank == 0:
            self.tokenizer.save_pretrained(out)
            # the run's resolved config beside the weights: evaluation takes the solver budgets from it
            (out / "run_config.json").write_text(json.dumps(OmegaConf.to_container(self.cfg, resolve=True), indent=1))
            write_environment(out)  # package versions and CPU: what two runs of one seed on two machines may differ in
        return out


def forget_last_step(trainer) -> None:
    """Forget the step-only scalars of the previous step, whoever logged them, so a tag with no value at this step
    is absent from every logger and from ``trainer.callback_metrics`` (the collapse guard, the progress bar).

    Why: Lightning keeps each logged key and re-emits its last value at every later step of the epoch, so a tag
    missing from this step's ``log_dict`` showed the previous step's value (issue 72)."""
    results = getattr(trainer, "_results", None)
    if results is None:
        return
    stale = set()
    for item in results.values():
        if item.meta.on_step and not item.meta.on_epoch:
            item.reset()
            stale.add(item.meta.name)
    connector = trainer._logger_connector
    for kept in (connector._callback_metrics, connector._logged_metrics, connector._progress_bar_metrics):
        for name in stale:
            kept.pop(name, None)


def finite(metrics: dict[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
