"""A generated batch as plain checkpoint values, and back: the in-flight batch of ``rollout.mode=async``.

Why: checkpoints are loaded with ``torch.load(weights_only=True)`` (``policy/checkpoint_io.py``), which
refuses arbitrary pickled objects, and a resumed asynchronous run must train exactly the batch the
interrupted one would have (it was sampled with weights the checkpoint no longer holds). So the batch is
stored as nested dicts, lists, strings, numbers and tensors only: every dataclass becomes its import path
and its attributes. Decoding rebuilds only dataclasses defined in ``score_lightning`` itself.

Numpy scalars become plain Python values (``np.float64`` is a ``float`` and ``np.str_`` a ``str``, yet
``weights_only`` refuses them); any other subclass of a plain type (an enum, say) is refused at save.
A checkpoint outlives the code that wrote it: a dataclass field added since takes its default at load,
and a field without one is refused by class and name (``validate_checkpoint`` does so before any model
loads), never left missing for the step to trip over.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

_PACKAGE = "score_lightning."
#: modules that moved since a checkpoint may have been written (the core and plug-ins layout): a stored
#: dataclass path from before the move is rebuilt from its new home
MOVED = {
    "score_lightning.callbacks.evaluator_pairs": "score_lightning.evaluation.pair_probe",
    "score_lightning.callbacks.progress": "score_lightning.telemetry.progress",
    "score_lightning.evaluation.drb2_tasks": "score_lightning.data.drb2_tasks",
    "score_lightning.evaluation.score_signal": "score_lightning.rewards.score_signal",
    "score_lightning.roles.mams_prompts": "score_lightning.methods.mams.prompts",
    "score_lightning.roles.rubricem_prompts": "score_lightning.methods.rubricem.prompts",
    "score_lightning.roles.step_judge": "score_lightning.methods.arco.judge",
    "score_lightning.rollout.async_worker": "score_lightning.generation.async_worker",
    "score_lightning.rollout.mams": "score_lightning.methods.mams.agent",
    "score_lightning.rollout.stages": "score_lightning.methods.rubricem.stages",
    "score_lightning.rubrics.base": "score_lightning.step.rubric_source",
    "score_lightning.rubrics.dr_rubric": "score_lightning.methods.drrubric.dr_rubric",
    "score_lightning.rubrics.given": "score_lightning.methods.given.rubrics",
    "score_lightning.rubrics.evolving": "score_lightning.methods.rler.evolving",
    "score_lightning.rubrics.item_writer": "score_lightning.methods.rler.item_writer",
    "score_lightning.rubrics.items": "score_lightning.methods.rler.items",
    "score_lightning.rubrics.preference": "score_lightning.methods.preference.reward",
    "score_lightning.rubrics.preference_groups": "score_lightning.methods.preference.groups",
    "score_lightning.rubrics.preference_pairs": "score_lightning.methods.preference.pairs",
    "score_lightning.rubrics.research_prompts": "score_lightning.methods.rler.research_prompts",
    "score_lightning.sft.item_demos": "score_lightning.methods.rler.demos",
    "score_lightning.sft.mams_demos": "score_lightning.methods.mams.demos",
    "score_lightning.sft.rubricem_demos": "score_lightning.methods.rubricem.demos",
    "score_lightning.sft.step_demos": "score_lightning.methods.arco.demos",
    "score_lightning.sft.text": "score_lightning.roles.text",
    "score_lightning.step.batch_codec": "score_lightning.generation.batch_codec",
    "score_lightning.step.generation": "score_lightning.generation.generator",
    "score_lightning.step.prefetch": "score_lightning.generation.prefetch",
    "score_lightning.step.stage_credit": "score_lightning.methods.rubricem.credit",
    "score_lightning.step.step_rewards": "score_lightning.methods.arco.step_rewards",
}


def encode(obj: Any, where: str = "batch") -> Any:
    """``obj`` as checkpoint-safe values; a type it cannot store raises ``TypeError`` naming where it sits."""
    if isinstance(obj, np.generic):  # before the plain types: np.float64 is a float, np.str_ a str
        item = obj.item()
        if isinstance(item, np.generic):  # np.longdouble has no plain equivalent
            raise TypeError(f"{where}: cannot store a numpy {type(obj).__name__} in a checkpoint")
        return encode(item, where)
    if obj is None or type(obj) in (bool, int, str):
        return obj
    if type(obj) is float:
        return {"__float__": repr(obj)} if not math.isfinite(obj) else obj
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": torch.from_numpy(np.ascontiguousarray(obj))}
    if isinstance(obj, list):
        return [encode(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return {"__tuple__": [encode(v, f"{where}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, (set, frozenset)):
        return {"__set__": [encode(v, where) for v in sorted(obj, key=repr)], "frozen": isinstance(obj, frozenset)}
    if isinstance(obj, dict):
        return {"__map__": [[encode(k, where), encode(v, f"{where}[{k!r}]")] for k, v in obj.items()]}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        cls = type(obj)
        if not cls.__module__.startswith(_PACKAGE):
            raise TypeError(f"{where}: dataclass {cls.__module__}.{cls.__qualname__} is outside score_lightning")
        fields = dataclasses.fields(obj)
        state = vars(obj) if hasattr(obj, "__dict__") else {f.name: getattr(obj, f.name) for f in fields}
        return {"__dataclass__": f"{cls.__module__}:{cls.__qualname__}",
                "fields": {k: encode(v, f"{where}.{k}") for k, v in state.items()}}
    raise TypeError(f"{where}: cannot store a {type(obj).__module__}.{type(obj).__qualname__} in a checkpoint")


def decode(data: Any) -> Any:
    """The inverse of :func:`encode`."""
    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    if "__float__" in data:
        return float(data["__float__"])
    if "__ndarray__" in data:
        return data["__ndarray__"].numpy()
    if "__tuple__" in data:
        return tuple(decode(v) for v in data["__tuple__"])
    if "__set__" in data:
        items = [decode(v) for v in data["__set__"]]
        return frozenset(items) if data.get("frozen") else set(items)
    if "__map__" in data:
        return {decode(k): decode(v) for k, v in data["__map__"]}
    if "__dataclass__" in data:
        cls = _dataclass(data["__dataclass__"])
        obj = object.__new__(cls)
        fields = {k: decode(v) for k, v in data["fields"].items()}
        fields.update(_missing_defaults(cls, data["__dataclass__"], fields))
        if hasattr(obj, "__dict__"):
            obj.__dict__.update(fields)  # also frozen dataclasses: their __init__ is bypassed, as pickle does
        else:
            for k, v in fields.items():
                object.__setattr__(obj, k, v)
        return obj
    raise ValueError(f"not an encoded batch value: keys {sorted(data)}")


def _missing_defaults(cls: type, path: str, stored: dict[str, Any]) -> dict[str, Any]:
    """Defaults of the fields of ``cls`` that ``stored`` lacks (the class gained them since the save);
    ``ValueError`` naming the class and the field when one has no default."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in stored:
            continue
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
        else:
            raise ValueError(f"the stored batch's {path} has no field {f.name!r}, which has no default: the "
                             f"checkpoint was written before {cls.__qualname__} gained it")
    return out


def _dataclass(path: str) -> type:
    module, _, name = path.partition(":")
    if not module.startswith(_PACKAGE):
        raise ValueError(f"refusing to rebuild {path!r}: only score_lightning dataclasses are stored")
    obj: Any = importlib.import_module(MOVED.get(module, module))
    for part in name.split("."):
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
        raise ValueError(f"{path!r} is not a dataclass")
    return obj


def check_stored_batch(path: Path, state: Any) -> None:
    """Rebuild the batch an asynchronous run had in flight, so one this code cannot resume (a dataclass
    field added since, without a default) is refused before any model loads, not inside the first step."""
    from score_lightning.policy.checkpoint_io import CheckpointError

    batch = state.get("async_rollouts", {}).get("batch") if isinstance(state, dict) else None
    if batch is None:
        return
    try:
        decode(batch)
    except (ValueError, TypeError, ImportError, AttributeError) as exc:
        raise CheckpointError(f"ckpt_path={path}: the batch in flight it stores cannot be rebuilt ({exc}); resume it "
                              "with the version of score-lightning that wrote it, or start fresh") from exc
