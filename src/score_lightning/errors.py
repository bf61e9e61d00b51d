"""The errors a run reports to its user as one plain ``error:`` block (no traceback), by exit code.

Kept free of heavy imports: ``src/train.py`` must refuse a bad config in seconds, before torch,
Lightning and transformers are imported.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A config value is out of range; the message names the key and the allowed values (exit 2)."""


class RetrieverUnavailable(RuntimeError):
    """The configured retriever did not answer before training started (exit 2)."""


class ModelUnavailable(RuntimeError):
    """The configured model cannot load (missing directory, uncached hub id offline, gated, unreachable) (exit 2)."""


class TrainingHalted(RuntimeError):
    """The run cannot continue safely (repeated non-finite updates, retrieval outage); a checkpoint was saved (exit 3)."""


class ColdStartUnavailable(RuntimeError):
    """The packaged cold start cannot be installed for a reason training it would meet too (a full disk, a
    cache directory it may not write, an unreadable base checkpoint): refused instead of retraining (exit 2)."""


class JudgeUnavailable(TrainingHalted):
    """Too many of a step's judgements failed at the external judge (``judge.max_failed_rate``): the step was not
    trained, and the last checkpoint is the one to resume from (exit 3)."""
