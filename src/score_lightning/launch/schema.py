"""The run's whole schema: the core's groups joined with each method's own nodes, stored in Hydra's ConfigStore.

Why here: the core's classes (:mod:`score_lightning.config`) name no method, and each method declares its
settings in its own folder (``methods/<name>/config.py``: ``NODES`` for a node under a core group, ``OPTIONS`` for
a group option's schema). This module, at the top of the layers, joins them: ``SolverConfig`` gains ``mams``,
``dpo`` and ``rubricem``; ``EvaluatorConfig`` gains ``preference``; ``rubric=evolving`` gets its own class.
Everything it imports is dataclasses: the schema is ready in well under a second, before torch loads.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

from hydra.core.config_store import ConfigStore

from score_lightning.config.fields import MISSING, node
from score_lightning.config.option_groups import OPTION_SCHEMAS
from score_lightning.config.run_groups import (ActorConfig, DataConfig, DebugConfig, HarnessConfig, JudgeConfig,
                                               LoggingConfig, ModelConfig, PathsConfig, ThreadsConfig, TrainerConfig)
from score_lightning.config.step_groups import (EvaluatorConfig, LossConfig, OptimConfig, RewardConfig, SolverConfig,
                                                VerifierConfig)
from score_lightning.sft.config import SftConfig

#: each method's schema module (light: dataclasses only)
METHOD_CONFIGS = ("score_lightning.methods.arco.config", "score_lightning.methods.dpo.config",
                  "score_lightning.methods.mams.config", "score_lightning.methods.rubricem.config", "score_lightning.methods.preference.config",
                  "score_lightning.methods.rler.config", "score_lightning.methods.given.config",
                  "score_lightning.methods.drrubric.config", "score_lightning.methods.judge.config",
                  "score_lightning.methods.rule.config")

#: the name of the root schema in the ConfigStore (``configs/train.yaml`` lists it first)
ROOT = "train_schema"

_CORE_GROUPS: dict[str, type] = {
    "threads": ThreadsConfig, "actor": ActorConfig, "solver": SolverConfig, "evaluator": EvaluatorConfig,
    "verifier": VerifierConfig, "reward": RewardConfig, "loss": LossConfig, "optim": OptimConfig,
    "logging": LoggingConfig, "debug": DebugConfig, "model": ModelConfig, "data": DataConfig, "judge": JudgeConfig,
    "harness": HarnessConfig, "sft": SftConfig, "trainer": TrainerConfig, "paths": PathsConfig,
}
#: groups whose options have their own classes (``OPTION_SCHEMAS``), and the open ones: a callback or a logger is
#: any class a user names with ``_target_`` (Lightning's, or their own: ``+callbacks.mine._target_=...``)
_OPEN_GROUPS = ("rollout", "retriever", "strategy", "rubric", "callbacks", "logger")


#: the registry behind each registry-backed key (imported only for a name no schema declares)
LIVE_REGISTRIES = {
    "optim.loss_type": ("score_lightning.step.loss_registry", "POLICY_LOSSES"),
    "optim.scale_rewards": ("score_lightning.step.loss_registry", "REWARD_SCALINGS"),
    "evaluator.reward": ("score_lightning.step.objectives", "EVALUATOR_REWARDS"),
    "reward.step": ("score_lightning.step.objectives", "STEP_CREDIT"),
    "solver.agent": ("score_lightning.rollout.workflows", "SOLVER_WORKFLOWS"),
    "solver.objective": ("score_lightning.step.solver_objective", "SOLVER_OBJECTIVES"),
    "reward.source": ("score_lightning.step.scoring_sources", "REWARD_SOURCES"),
    "evaluator.source": ("score_lightning.step.scoring_sources", "EVALUATOR_SOURCES"),
}


def declared_names() -> dict[str, set[str]]:
    """The names each method declares it registers (``methods/<name>/config.py``: ``NAMES``), by config key."""
    out: dict[str, set[str]] = {}
    for name in METHOD_CONFIGS:
        for key, names in getattr(importlib.import_module(name), "NAMES", {}).items():
            out.setdefault(key, set()).update(names)
    return out


def method_checks() -> dict[tuple[str, str], Callable[[Any], list[str]]]:
    """Each method's rules across keys (``CHECKS``), by the (config key, name) that selects the method."""
    out: dict[tuple[str, str], Callable[[Any], list[str]]] = {}
    for name in METHOD_CONFIGS:
        out.update(getattr(importlib.import_module(name), "CHECKS", {}))
    return out


def known_names(key: str) -> set[str]:
    """The names ``key`` may take without asking its registry: the core's (its schema field's) and the methods'."""
    meta = {f.name: f.metadata for f in dataclasses.fields(schema_class(key.rsplit(".", 1)[0]))}[key.rsplit(".", 1)[1]]
    return set(meta.get("registry", ())) | declared_names().get(key, set())


def live_names(key: str) -> list[str]:
    """The names registered under ``key`` now (the shipped methods and any the process registered itself)."""
    module, attr = LIVE_REGISTRIES[key]
    return getattr(importlib.import_module(module), attr).names()


def _method_schemas() -> tuple[dict[str, type], dict[str, dict[str, type]]]:
    nodes: dict[str, type] = {}
    options: dict[str, dict[str, type]] = {g: dict(o) for g, o in OPTION_SCHEMAS.items()}
    for name in METHOD_CONFIGS:
        module = importlib.import_module(name)
        nodes.update(getattr(module, "NODES", {}))
        for group, entries in getattr(module, "OPTIONS", {}).items():
            options.setdefault(group, {}).update(entries)
    return nodes, options


def _with_nodes(cls: type, extra: dict[str, type]) -> type:
    """``cls`` with the method nodes under it as typed fields (a subclass of the same name)."""
    if not extra:
        return cls
    fields = [(name, sub, node(sub)) for name, sub in sorted(extra.items())]
    return dataclasses.make_dataclass(cls.__name__, fields, bases=(cls,))


def build_schema() -> tuple[type, dict[str, dict[str, type]]]:
    """The root dataclass of a run's config and each group's option classes."""
    nodes, options = _method_schemas()
    groups = {}
    for group, cls in _CORE_GROUPS.items():
        extra = {key.split(".", 1)[1]: sub for key, sub in nodes.items() if key.split(".", 1)[0] == group}
        groups[group] = _with_nodes(cls, extra)
    fields: list[tuple[str, Any, Any]] = [
        ("task_name", str, dataclasses.field(default=MISSING)), ("seed", int, dataclasses.field(default=MISSING)),
        ("ckpt_path", Any, dataclasses.field(default=None)), ("resume_in_place", bool, dataclasses.field(default=MISSING)),
    ]
    fields += [(group, cls, node(cls)) for group, cls in groups.items()]
    fields += [(group, Any, dataclasses.field(default=MISSING)) for group in _OPEN_GROUPS]
    return dataclasses.make_dataclass("TrainConfig", fields), options


_registered = False


def register_schema() -> None:
    """Store the root schema and each option's class in Hydra's ConfigStore (once per process)."""
    global _registered
    if _registered:
        return
    root, options = build_schema()
    store = ConfigStore.instance()
    store.store(name=ROOT, node=root)
    for group, entries in options.items():
        for name, cls in entries.items():
            store.store(group=group, name=name, node=cls)
    _registered = True


def schema_class(path: str) -> type | None:
    """The dataclass of the node at ``path`` (e.g. ``solver.mams``), or None for an open node."""
    root, _ = build_schema()
    cls: Any = root
    for part in path.split(".") if path else []:
        hit = {f.name: f for f in dataclasses.fields(cls)}.get(part)
        if hit is None or "node" not in hit.metadata:
            return None
        cls = hit.metadata["node"]
    return cls


def compose_config(overrides: list[str], config_dir: str | None = None, config_name: str = "train"):
    """The run's config as ``src/train.py`` composes it (the schema registered first), for scripts and tests."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from score_lightning.paths import CONFIG_DIR

    register_schema()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir or CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name=config_name, overrides=list(overrides))
    GlobalHydra.instance().clear()
    return cfg
