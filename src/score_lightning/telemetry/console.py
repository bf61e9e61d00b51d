"""One clean console: each log line once, no library noise that says nothing about the run."""

from __future__ import annotations

import logging
import warnings


#: the start of Lightning's ModelCheckpoint warning under manual optimisation (a regex for ``warnings``)
MANUAL_CHECKPOINT_WARNING = (r"Using ModelCheckpoint with manual optimization and every_n_train_steps, but no "
                             r"pre-optimization state was saved")
#: torch's warning when a scheduler steps before its optimiser ever has (a regex for ``warnings``)
SCHEDULER_FIRST_WARNING = r"Detected call of `lr_scheduler\.step\(\)` before `optimizer\.step\(\)`"
#: a resume in place writes into the checkpoints/ folder that holds what it resumed (a regex for ``warnings``)
RESUME_CHECKPOINT_DIR_WARNING = r"Checkpoint directory .+ exists and is not empty\.$"
#: log records that say nothing about the run, by logger: each message dropped only when it is exactly this
QUIET_RECORDS: dict[str, tuple[str, ...]] = {
    # bm25s sets its own logger to DEBUG, so each index build printed this through Hydra's handler
    "bm25s": ("Building index from tokens",),
    # the first import of matplotlib on a machine (Lightning imports torchmetrics, which imports it)
    "matplotlib.font_manager": ("generated new fontManager",
                                "Matplotlib is building the font cache; this may take a moment."),
    # a save that leaves weights_only unset; ours set it, Lightning's SLURM requeue save does not
    "lightning.pytorch.trainer.connectors.checkpoint_connector": (
        "`weights_only` was not set, defaulting to `False`.",),
}


class _DropTips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith("💡 Tip")


class _DropMessages(logging.Filter):
    def __init__(self, messages: tuple[str, ...]) -> None:
        super().__init__()
        self.messages = frozenset(messages)

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() not in self.messages


def quiet_libraries() -> None:
    """Drop the records of :data:`QUIET_RECORDS`. Imports nothing heavy: ``src/train.py`` calls it before Lightning
    (and with it matplotlib) is imported."""
    for name, messages in QUIET_RECORDS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessages) for f in logger.filters):
            logger.addFilter(_DropMessages(messages))


def quiet_resume_in_place() -> None:
    """A run resumed in its own folder finds its checkpoints there: Lightning's warning about it is expected."""
    warnings.filterwarnings("ignore", message=RESUME_CHECKPOINT_DIR_WARNING, category=UserWarning)


def quiet_console() -> None:
    """Route Lightning's records through the root handlers (Hydra's), drop advertising and known noise.

    Lightning attaches its own stream handler when it is imported before logging is configured, so
    every line printed twice under Hydra. The frozen KL reference is in eval mode on purpose, and
    per-file weight-loading bars add nothing to a training log.
    """
    if logging.getLogger().handlers:
        for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
            lg = logging.getLogger(name)
            lg.handlers.clear()
            lg.propagate = True
    quiet_libraries()
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_DropTips())
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
    warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode.*")
    # ModelCheckpoint under manual optimisation: the state *after* the update is what exact resume needs
    # (docs/RELIABILITY.md), so its 14-line advice to save the pre-update state is not for this trainer
    warnings.filterwarnings("ignore", message=MANUAL_CHECKPOINT_WARNING, category=UserWarning)
    # schedules count SCORE steps (optim.warmup_steps is in steps), so they step every SCORE step even when
    # an optimiser did not: the evaluator's every U steps, the solver's when no group was informative
    warnings.filterwarnings("ignore", message=SCHEDULER_FIRST_WARNING, category=UserWarning)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass
