"""One clean console: each log line once, no library noise that says nothing about the run."""

from __future__ import annotations

import logging
import warnings


#: the start of Lightning's ModelCheckpoint warning under manual optimisation (a regex for ``warnings``)
MANUAL_CHECKPOINT_WARNING = (r"Using ModelCheckpoint with manual optimization and every_n_train_steps, but no "
                             r"pre-optimization state was saved")
#: torch's warning when a scheduler steps before its optimiser ever has (a regex for ``warnings``)
SCHEDULER_FIRST_WARNING = r"Detected call of `lr_scheduler\.step\(\)` before `optimizer\.step\(\)`"


class _DropTips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith("💡 Tip")


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
