"""``ScoreCheckpoint``: ``checkpoints/last.ckpt`` every N SCORE steps and at the end of fit."""

from __future__ import annotations

from lightning.pytorch.callbacks import ModelCheckpoint


class ScoreCheckpoint(ModelCheckpoint):
    """A ``ModelCheckpoint`` that keeps ``last.ckpt`` current.

    ``global_step`` equals the SCORE step (see ``ScoreModule.advance_global_step``), so
    ``every_n_train_steps`` counts SCORE steps. The final state is also saved when fit ends on a
    step that is not a multiple of N, so a finished run always resumes from its real end.
    Writes are atomic (see ``checkpoint_io.AtomicCheckpointIO``).
    """

    def __init__(self, dirpath: str, every_n_steps: int = 10, **kwargs):
        # auto_insert_metric_name=False: "step-000050.ckpt", the name a user types, not "step-step=000050.ckpt"
        super().__init__(dirpath=dirpath, filename="step-{step:06d}", every_n_train_steps=every_n_steps,
                         save_last=True, save_top_k=1, enable_version_counter=False, auto_insert_metric_name=False,
                         **kwargs)

    def save_last_now(self, trainer) -> None:
        """Write ``last.ckpt`` for the current step unless it is already saved (collective)."""
        if self._last_global_step_saved != trainer.global_step:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
            self._last_global_step_saved = trainer.global_step

    def on_train_end(self, trainer, pl_module) -> None:
        self.save_last_now(trainer)
