"""Validate the whole config before any model loads: fail in seconds, naming the key and what is allowed.

One module per group of keys; each appends to the same :class:`Checks`, so a user sees every bad
value at once, not just the first.
"""

from __future__ import annotations

from omegaconf import DictConfig

from score_lightning.launch.schema_checks import schema_problems
from score_lightning.errors import ConfigError  # re-exported: callers import it from here
from score_lightning.launch.schema import declared_names, live_names
from score_lightning.launch.config_validation.asynchronous import check_async
from score_lightning.launch.config_validation.judge import check_judge
from score_lightning.launch.config_validation.model import (LOW_PRECISION_MAX_LR, check_model, pretrained_model,
                                                            sft_enabled)
from score_lightning.launch.config_validation.roles import check_evaluator, check_reward, check_solver
from score_lightning.launch.config_validation.run import check_run
from score_lightning.launch.config_validation.topology import data_parallel_processes, data_parallel_size
from score_lightning.launch.config_validation.update import check_update
from score_lightning.launch.config_validation.values import Checks

__all__ = ["ConfigError", "LOW_PRECISION_MAX_LR", "data_parallel_processes", "data_parallel_size",
           "pretrained_model", "sft_enabled", "validate_config"]


def validate_config(cfg: DictConfig, ask_registries: bool = True) -> None:
    """Raise :class:`ConfigError` listing every bad value (all of them, not just the first).

    ``ask_registries=False`` (the command line, before torch loads): a registry-backed name is checked against the
    names the core and the methods declare, never by importing the registry, so a typo is refused in about half a
    second; the command line reaches only the methods' plug-ins, and each declares what it registers."""
    checks = Checks(cfg, live_names if ask_registries else None)
    # unknown keys, ranges, allowed sets and registered names: the schema states them (launch/schema.py)
    checks.errors.extend(schema_problems(cfg, declared_names(), checks.live))
    for group in (check_run, check_solver, check_evaluator, check_reward, check_update, check_model, check_async,
                  check_judge):
        group(checks)
    checks.raise_any()
