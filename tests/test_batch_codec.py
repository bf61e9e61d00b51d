"""The in-flight batch of ``rollout.mode=async`` as checkpoint values: what loads with ``weights_only=True``,
and what happens to a batch stored before one of its dataclasses gained a field."""

from __future__ import annotations

import enum
import io
import math

import numpy as np
import pytest
import torch

from score_lightning.roles.answer import AnswerParse
from score_lightning.generation.async_worker import GeneratedBatch
from score_lightning.generation.batch_codec import decode, encode

BATCH = "score_lightning.generation.async_worker:GeneratedBatch"


def _through_a_checkpoint(value):
    buf = io.BytesIO()
    torch.save({"b": value}, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)["b"]


def _batch() -> GeneratedBatch:
    answer = AnswerParse("text [a]", True, "", ("a",), True, ())
    return GeneratedBatch(3, 2, ["q1"], ["prompt"], [answer], {"r": 1.0}, (0, 1, 1), rollout_s=1.5,
                          info={"wait_s": 0.25})


def test_numpy_scalars_become_plain_values_that_load_with_weights_only():
    """np.float64 is a float and np.str_ a str, so they used to pass the check as they were and then break
    ``torch.load(weights_only=True)``."""
    value = {"f": np.float64(1.5), "s": np.str_("doc_1"), "nan": np.float64("nan"), "b": np.bool_(True),
             "i": np.int64(7), "f32": np.float32(0.5), "ids": (np.str_("a"), np.str_("b"))}
    back = decode(_through_a_checkpoint(encode(value)))
    assert back["f"] == 1.5 and type(back["f"]) is float
    assert back["s"] == "doc_1" and type(back["s"]) is str
    assert math.isnan(back["nan"]) and type(back["nan"]) is float
    assert back["b"] is True and back["i"] == 7 and type(back["i"]) is int and back["f32"] == 0.5
    assert back["ids"] == ("a", "b") and all(type(x) is str for x in back["ids"])


def test_other_subclasses_of_plain_types_are_refused_where_they_sit():
    class Kind(str, enum.Enum):
        A = "a"

    with pytest.raises(TypeError, match=r"batch\[0\]\['k'\]: cannot store a .*Kind"):
        encode([{"k": Kind.A}])
    with pytest.raises(TypeError, match=r"batch: cannot store a numpy longdouble"):
        encode(np.longdouble(1.5))


def test_a_field_added_since_the_checkpoint_takes_its_default():
    stored = encode(_batch())
    del stored["fields"]["info"], stored["fields"]["rollout_s"]  # written before these fields existed
    del stored["fields"]["rollouts"][0]["fields"]["ungrounded"]  # in a frozen dataclass, too
    back = decode(_through_a_checkpoint(stored))
    assert back.info == {} and back.rollout_s == 0.0 and (back.step, back.version) == (3, 2)
    assert back.info is not decode(_through_a_checkpoint(stored)).info  # default_factory: a fresh dict each time
    assert back.rollouts[0].ungrounded == () and back.rollouts[0].cited_ids == ("a",)


def test_a_field_without_a_default_is_refused_by_class_and_name():
    stored = encode(_batch())
    del stored["fields"]["version"]
    with pytest.raises(ValueError, match=rf"{BATCH}.*'version'.*no default"):
        decode(stored)


def test_a_checkpoint_whose_batch_cannot_be_rebuilt_is_refused_before_anything_loads(tmp_path):
    from score_lightning.generation.batch_codec import check_stored_batch
    from score_lightning.policy.checkpoint_io import CheckpointError, validate_checkpoint

    stored = encode(_batch())
    del stored["fields"]["version"]
    path = tmp_path / "last.ckpt"
    torch.save({"state_dict": {}, "optimizer_states": [], "loops": {},
                "score": {"async_rollouts": {"discarded": 0, "batch": stored}}}, path)
    with pytest.raises(CheckpointError, match=r"last\.ckpt.*GeneratedBatch.*'version'"):
        validate_checkpoint(path, check_stored_batch)


def test_every_moved_module_has_a_home_that_imports():
    """A stored batch names its dataclasses by module; each old name the codec maps must lead to a module that
    exists now, or a checkpoint from before the move could not be rebuilt."""
    import importlib

    from score_lightning.generation.batch_codec import MOVED

    for old, new in MOVED.items():
        assert importlib.import_module(new), (old, new)
