"""The settings a held-out evaluation runs under: where they come from, how they are recorded, and when
two evaluations may be compared.

**Every checkpoint is evaluated as it was trained.** A checkpoint the project writes carries
``run_config.json``: an RL export the run's whole resolved config (``glue/outputs.py``), an SFT cold
start the part of it that evaluation reads (:func:`~score_lightning.data.run_config.write_run_settings`, called
by ``sft/run.py`` when the cold start is trained, installed from the package or reused; the file format lives in
:mod:`score_lightning.data.run_config`, below both). ``generate`` takes from it the keys
of :data:`DEFAULTS` (an explicit flag wins; without the file, the values there):

* the solver budgets ``solver.max_tool_calls``, ``max_response_tokens``, ``max_observation_tokens``, ``topk``;
* sampling, ``solver.temperature`` and ``solver.top_p`` (without a run config: greedy for one sample, 1.0 for more);
* what shapes the solver prompt: ``harness.initial_state`` (the fallback rubric and the constraints in
  the prompt), ``solver.conclusion_line`` and ``model.chat_template``;
* the reward rule a(r): ``reward.citations``, ``reward.require_citation``, ``reward.min_answer_chars``;
* the solver's workflow: a run with ``solver.agent=mams`` is rolled out by MaMs's search / state / report roles
  under its ``solver.mams`` budgets, one with ``solver.agent=rubricem`` under RubricEM's four-stage prompt
  (:data:`WORKFLOW_KEYS`; recorded only then, so ReAct settings are unchanged).

Settings are a flat dict keyed by those config names (:func:`resolve_settings`). ``generate`` prints them
as one block, writes them to ``<out>.settings.json`` (a resume under other settings is refused, so no file
mixes them), and the card carries them: :func:`settings_diff` names the keys on which two cards differ.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from score_lightning.data.run_config import (  # the file format, shared with the cold start that writes it
    DEFAULTS,
    RUN_CONFIG,
    WORKFLOW_KEYS,
    evaluation_subset,
    read_run_config,
    write_run_settings,
)
from score_lightning.data.run_config import select_key as _select

log = logging.getLogger(__name__)

BUDGET_KEYS = ("solver.max_tool_calls", "solver.max_response_tokens", "solver.max_observation_tokens", "solver.topk")
_INT_KEYS = BUDGET_KEYS + ("reward.min_answer_chars",)
_FLOAT_KEYS = ("solver.temperature", "solver.top_p")
_BOOL_KEYS = ("solver.conclusion_line", "reward.require_citation")
#: the solver's workflow (``solver.agent``, default react; its keys: ``WORKFLOW_KEYS``) when it is not react
_REACT_ONLY = ("solver.agent", "react")
AGENTS = ("react", "mams", "rubricem")


def stored_run_config(run: dict) -> dict:
    """A stored run config (``run_config.json``: a whole resolved config, or the cold start's subset) read as the
    current config names its keys: :func:`~score_lightning.evaluation.stored_config.upgrade_stored_config` maps the keys
    removed since it was written; a key it predates stays absent, and :data:`DEFAULTS` applies to it."""
    if not run:
        return {}
    from omegaconf import OmegaConf

    from score_lightning.evaluation.stored_config import upgrade_stored_config

    return OmegaConf.to_container(upgrade_stored_config(run), resolve=False)


def run_values(run: dict) -> dict[str, Any]:
    """The :data:`DEFAULTS` keys a run config sets, typed."""
    run = stored_run_config(run)
    out: dict[str, Any] = {}
    for key in DEFAULTS:
        value = _select(run, key)
        if value is KeyError or value is None:
            continue
        if key == "model.chat_template" and "{" not in value and not Path(value).expanduser().is_file():
            log.info("run config: model.chat_template=%r is not here; the checkpoint's tokenizer keeps its own", value)
            continue
        if key in _INT_KEYS:
            value = int(value)
        elif key in _FLOAT_KEYS:
            value = float(value)
        elif key in _BOOL_KEYS:
            value = bool(value)
        out[key] = value
    agent = _select(run, _REACT_ONLY[0])
    if agent == "mams":  # rolled out by its own workflow (evaluation/generate.py)
        mams = _select(run, "solver.mams")
        out.update({"solver.agent": "mams", "solver.mams": dict(mams) if isinstance(mams, dict) else {}})
    elif agent == "rubricem":  # its four-stage prompt (the reflection memory is empty for held-out queries)
        out["solver.agent"] = "rubricem"
    elif agent not in (KeyError, None, _REACT_ONLY[1]):
        log.warning("the run used solver.agent=%s; generate rolls out the react loop (one <search>/<answer> "
                    "conversation), so this evaluation is not the run's own agent", agent)
    return out


def resolve_settings(flags: dict[str, Any], run: dict, samples: int) -> tuple[dict[str, Any], dict[str, str]]:
    """The settings generate uses, and where each came from (``flag``, ``run`` or ``default``).

    ``flags``: the values given on the command line (``None``: not given). An explicit flag wins, then
    the run config's value, then :data:`DEFAULTS`.
    """
    trained = run_values(run)
    settings: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for key, default in DEFAULTS.items():
        if flags.get(key) is not None:
            settings[key], origin[key] = flags[key], "flag"
        elif key in trained:
            settings[key], origin[key] = trained[key], "run"
        else:
            settings[key], origin[key] = default, "default"
    for key in WORKFLOW_KEYS:  # the run's own workflow, when it was not react
        if key in trained:
            settings[key], origin[key] = trained[key], "run"
    if settings["solver.temperature"] is None:
        settings["solver.temperature"] = 0.0 if samples <= 1 else 1.0
    return settings, origin


def template_label(template: str | None) -> str | None:
    """What a settings record says of a chat template: None (the checkpoint's own) or ``sha256:<12 hex>``."""
    if not template:
        return None
    if "{" not in template and Path(template).expanduser().is_file():
        template = Path(template).expanduser().read_text(encoding="utf-8")
    return "sha256:" + hashlib.sha256(template.encode("utf-8")).hexdigest()[:12]


def normalise_state(state: dict | None) -> dict:
    """A harness state as recorded: validated and complete (defaults filled in), without its version,
    and without the dimension pool when it is the default one (it is long and rarely changed)."""
    from score_lightning.harness.state import DEFAULT_DIMENSION_POOL, HarnessState

    full = HarnessState.from_dict(dict(state or {})).to_dict()
    full.pop("version", None)
    if full.get("dimension_pool") == DEFAULT_DIMENSION_POOL:
        full.pop("dimension_pool")
    return full


def settings_diff(a: dict | None, b: dict | None) -> list[str]:
    """The keys whose values differ between two settings records (a key absent from one differs);
    ``["settings"]`` when either record is missing (a card made before settings were recorded)."""
    if a is None or b is None:
        return ["settings"]
    return sorted(k for k in set(a) | set(b) if a.get(k, KeyError) != b.get(k, KeyError))


def describe_diff(a: dict | None, b: dict | None, names: tuple[str, str] = ("this", "baseline")) -> str:
    """The differences of two settings records, one ``key (x this, y baseline)`` each; a differing harness
    state is named down to its differing fields (``harness.initial_state.dimension_constraints.k``)."""
    if a is None or b is None:
        missing = names[0] if a is None else names[1]
        return f"no settings recorded for {missing} (made before settings were recorded)"

    def leaves(x: Any, y: Any, key: str) -> list[str]:
        if isinstance(x, dict) and isinstance(y, dict):
            return [d for k in sorted(set(x) | set(y)) for d in leaves(x.get(k, KeyError), y.get(k, KeyError), f"{key}.{k}")]
        if x == y:
            return []
        show = ["absent" if v is KeyError else json.dumps(v) for v in (x, y)]
        return [f"{key} ({show[0]} {names[0]}, {show[1]} {names[1]})"]

    return ", ".join(d for k in settings_diff(a, b) for d in leaves(a.get(k, KeyError), b.get(k, KeyError), k))


def _short(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    if value is None:
        return {"model.chat_template": "checkpoint's own", "harness.initial_state": "HarnessState() defaults"}.get(
            key, "none")
    return str(value)


def format_settings(settings: dict[str, Any], origin: dict[str, str] | None = None, *, source: str | None = None,
                    extra: dict[str, Any] | None = None) -> str:
    """One compact block: budgets, sampling, prompt, reward rule; keys given by a flag are starred."""
    origin = origin or {}

    def part(keys: list[str]) -> str:
        return " ".join(f"{k.split('.')[-1]}={_short(k, settings.get(k))}{'*' if origin.get(k) == 'flag' else ''}"
                        for k in keys)

    head = f"settings (from {source}; * = flag):" if source else "settings (no run config: defaults; * = flag):"
    sampling = part(["solver.temperature", "solver.top_p"])
    if extra:
        sampling = " ".join(f"{k}={_short(k, v)}" for k, v in extra.items()) + " " + sampling
    return "\n".join([
        head,
        "  budgets:  " + part(list(BUDGET_KEYS)),
        "  sampling: " + sampling,
        "  prompt:   " + part(["solver.conclusion_line", "model.chat_template"]),
        "            " + part(["harness.initial_state"]),
        "  reward:   " + part(["reward.citations", "reward.require_citation", "reward.min_answer_chars"]),
    ])


def settings_path_for(out: str | os.PathLike) -> Path:
    """The settings sidecar of an article file: ``<out>.settings.json``."""
    out = Path(out)
    return out.with_name(out.name + ".settings.json")
