"""Read a config stored by an older run (a checkpoint's ``hyper_parameters["cfg"]``, an export's ``run_config.json``).

Why: a stored config predates whatever keys were added or removed since. A key added later is simply absent
(its reader takes the field's default from the current YAML); a removed key is mapped to its new home when the
meaning carries over, so an old run is read as it ran, and never surfaces as an ``AttributeError``.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf


def _pop(tree: dict, dotted: str) -> Any:
    group, _, key = dotted.partition(".")
    node = tree.get(group)
    return node.pop(key, None) if isinstance(node, dict) else None


def _set_missing(tree: dict, dotted: str, value: Any) -> None:
    group, _, key = dotted.partition(".")
    node = tree.setdefault(group, {})
    if isinstance(node, dict) and (key not in node or isinstance(node[key], str) and node[key].startswith("${")):
        node[key] = value


def upgrade_stored_config(stored: Mapping[str, Any]) -> DictConfig:
    """``stored`` with the removed keys mapped: ``loss.clip_ratio_*`` -> ``optim.clip_ratio_*`` (where the stored
    optim node did not hold the value itself), ``loss.norm_adv_by_std`` -> ``optim.scale_rewards`` (false meant
    none, true meant group), ``optim.warmup_ratio`` dropped when null (the only value it could hold and still be
    read as ``optim.warmup_steps``); a set ``warmup_ratio`` is kept under ``optim`` for the reader to name."""
    tree = copy.deepcopy(OmegaConf.to_container(OmegaConf.create(dict(stored)), resolve=False))
    for side in ("low", "high"):
        value = _pop(tree, f"loss.clip_ratio_{side}")
        if value is not None:
            _set_missing(tree, f"optim.clip_ratio_{side}", value)
    norm = _pop(tree, "loss.norm_adv_by_std")
    if isinstance(norm, bool):
        _set_missing(tree, "optim.scale_rewards", "group" if norm else "none")
    optim = tree.get("optim")  # data, not config
    if isinstance(optim, dict) and optim.get("warmup_ratio", 0) is None:  # data, not config
        optim.pop("warmup_ratio")
    return OmegaConf.create(tree)
