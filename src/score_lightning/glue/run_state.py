"""The run state beyond the weights, and how a checkpoint carries it: exact resume restores the step
counter, data position, EMA baseline, scheduler statistics, harness state, fault counters, the evaluator
objectives' state, rubric buffers, every rank's RNG and, under ``rollout.mode=async``, the batch the worker had in
flight."""

from __future__ import annotations

from score_lightning import distributed as D
from score_lightning.harness.state import HarnessState
from score_lightning.telemetry.loggers import add_score_layout
from score_lightning.rng import rng_state, seed_rank, set_rng_state


class RunStateHooks:
    """Harness-state access and the checkpoint hooks of :class:`~score_lightning.module.ScoreModule`."""

    @property
    def harness_state(self) -> HarnessState:
        return self._harness_state

    @harness_state.setter
    def harness_state(self, state: HarnessState) -> None:
        """A refresh may edit the dimension pool; the scheduler follows it."""
        if list(state.dimension_pool) != list(self._harness_state.dimension_pool):
            self.scheduler.set_pool(list(state.dimension_pool))
        self._harness_state = state

    def set_harness_window(self, steps: int) -> None:
        """The meta-harness callback's period M: its statistics are means over the last M steps."""
        self.stats_window.resize(steps)

    def harness_stats(self) -> dict[str, float]:
        """Means over the last M steps, plus dimension frequencies: what the meta-harness reacts to."""
        stats = self.stats_window.means()
        stats.update({f"dims/{name}_freq": float(f) for name, f in self.scheduler.frequencies().items()})
        return stats

    def advance_global_step(self) -> None:
        """Make Lightning's ``global_step`` count SCORE steps.

        Under manual optimisation ``global_step`` is the number of ``LightningOptimizer.step`` calls;
        a SCORE step makes zero (frozen solver, skipped update) to many (PPO mini-batches, evaluator)
        raw optimiser calls, so the progress counter is advanced here exactly once per step.
        """
        progress = self.trainer.fit_loop.epoch_loop.manual_optimization.optim_step_progress
        progress.increment_ready()
        progress.increment_completed()

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["score"] = {
            "score_step": self.score_step, "data_cursor": self.data_cursor, "baseline": self.baseline.state_dict(),
            "scheduler": self.scheduler.state_dict(), "harness_state": self.harness_state.to_dict(),
            **self.faults.state_dict(), **{k: v for o in self.objectives for k, v in o.state_dict().items()},
            "recent": self.stats_window.state(),
            "rng": rng_state(),
            # every rank's RNG (dump_checkpoint runs on all ranks; rank 0 writes the file)
            "rng_per_rank": D.gather_objects(rng_state()),
            # per-query rubric buffers live on the rank that saw the query: keep every rank's
            "rubric_source": D.gather_objects(self.rubric_source.state_dict()),
        }
        if self.prefetch is not None:  # rollout.mode=async: the batch in flight, sampled by weights no longer held
            checkpoint["score"]["async_rollouts"] = self.prefetch.state_dict()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        s = checkpoint.get("score")  # data, not config
        if s is None:
            raise ValueError("checkpoint has no 'score' section: not a score-lightning checkpoint")
        self.score_step, self.data_cursor = int(s["score_step"]), int(s["data_cursor"])
        self.baseline.load_state_dict(s["baseline"])
        self.harness_state = HarnessState.from_dict(s["harness_state"])
        self.scheduler.load_state_dict(s["scheduler"])
        self.faults.load_state_dict(s)
        for objective in self.objectives:  # the evaluator's objectives: their baselines, RubricEM's memory
            objective.load_state_dict(s)
        self.stats_window.load(s.get("recent", []))
        merged: dict = {}
        for part in s.get("rubric_source") or []:
            merged.update(part)
        self.rubric_source.load_state_dict(merged)
        if self.prefetch is not None and s.get("async_rollouts"):
            self.prefetch.load_state_dict(s["async_rollouts"])
        per_rank = s.get("rng_per_rank") or [s["rng"]]
        self._pending_rng = per_rank[self.global_rank] if self.global_rank < len(per_rank) else s["rng"]
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if dm is not None and hasattr(dm, "set_start_cursor"):
            dm.set_start_cursor(self.data_cursor)

    def on_train_start(self) -> None:
        if self.trainer.is_global_zero:
            add_score_layout(self.trainer.loggers)  # TensorBoard's "SCORE" custom-scalars page
        # RNG is restored last, after setup consumed whatever it needed, so sampling resumes exactly.
        if self._pending_rng is not None:
            set_rng_state(self._pending_rng)
            self._pending_rng = None
        elif self.global_rank > 0:
            seed_rank(int(self.cfg.seed), self.global_rank)
