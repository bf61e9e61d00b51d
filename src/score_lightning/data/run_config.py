"""``run_config.json``: the run settings a checkpoint carries, as a file format.

Here, below the cold start and evaluation, because both use it: the SFT cold start writes the part of its
config that evaluation reads beside its weights (:func:`write_run_settings`, from ``sft/run.py``) and leaves the
file out of a packaged asset (``sft/asset.py``); ``scripts/evaluate.py`` reads it back and resolves its settings
from it (:mod:`score_lightning.evaluation.settings`, which says what each key does).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

RUN_CONFIG = "run_config.json"

#: the config keys generate reads from a checkpoint's ``run_config.json``, and the value without one
#: (``solver.temperature`` None: greedy for one sample, 1.0 for more; ``harness.initial_state`` None: the
#: ``HarnessState()`` defaults; ``model.chat_template`` None: the checkpoint's own)
DEFAULTS: dict[str, Any] = {
    "solver.max_tool_calls": 10,
    "solver.max_response_tokens": 4096,
    "solver.max_observation_tokens": 512,
    "solver.topk": 3,
    "solver.temperature": None,
    "solver.top_p": 1.0,
    "solver.conclusion_line": True,
    "harness.initial_state": None,
    "model.chat_template": None,
    "reward.citations": "any",
    "reward.require_citation": False,
    "reward.min_answer_chars": 20,
}
#: the solver's workflow (``solver.agent``, default react) and MaMs's role budgets; in the settings only for MaMs
WORKFLOW_KEYS = ("solver.agent", "solver.mams")


def select_key(nested: dict, dotted: str) -> Any:
    """``nested``'s value at a dotted config key; ``KeyError`` (the class) when a part is absent."""
    node: Any = nested
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return KeyError
        node = node[part]
    return node


def read_run_config(path: str | os.PathLike | None) -> dict:
    """The JSON at ``path`` (a ``run_config.json``, or a directory holding one); ``{}`` when absent."""
    if path is None:
        return {}
    p = Path(path)
    if p.is_dir():
        p = p / RUN_CONFIG
    if not p.is_file():
        return {}
    data = json.loads(p.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def evaluation_subset(cfg) -> dict:
    """The part of a run's config (an OmegaConf node or a plain dict) that evaluation reads, nested as in
    the config, so one reader serves it and a whole ``run_config.json``. A chat template given as a file
    is stored as its text (the file may not exist where the checkpoint is evaluated)."""
    if not isinstance(cfg, dict):
        from omegaconf import OmegaConf

        cfg = OmegaConf.to_container(cfg, resolve=True)
    out: dict[str, Any] = {}
    for key in (*DEFAULTS, *WORKFLOW_KEYS):
        value = select_key(cfg, key)
        if value is KeyError:
            continue
        if key == "model.chat_template" and value and "{" not in value and Path(value).expanduser().is_file():
            value = Path(value).expanduser().read_text(encoding="utf-8")
        section, name = key.rsplit(".", 1)
        node = out
        for part in section.split("."):
            node = node.setdefault(part, {})
        node[name] = value
    return out


def write_run_settings(directory: str | os.PathLike, cfg, note: str = "") -> Path:
    """Write :func:`evaluation_subset` of ``cfg`` as ``<directory>/run_config.json`` (atomically).

    A cache directory is shared by every run whose cold-start key matches, so the first writer wins;
    a later run whose settings differ gets a warning naming the keys (evaluate it with its own export's
    ``--run-config``, or flags).
    """
    path = Path(directory) / RUN_CONFIG
    subset = evaluation_subset(cfg)
    if path.is_file():
        kept = read_run_config(path)
        differ = [k for k in DEFAULTS if select_key(kept, k) != select_key(subset, k)]
        if differ:
            log.warning("%s records another run's settings (%s differ from this run's); kept as they are",
                        path, ", ".join(differ))
        return path
    body = {**subset, "_note": note} if note else subset
    tmp = path.with_name(f".{RUN_CONFIG}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path
