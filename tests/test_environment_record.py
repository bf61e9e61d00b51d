"""environment.json: the versions it records are the installed ones, and it is valid JSON on disk."""

from __future__ import annotations

import json

import numpy
import sklearn
import torch

from score_lightning.glue.environment import ENVIRONMENT, environment_record, write_environment


def test_the_record_names_the_installed_versions_and_the_cpu(tmp_path):
    record = environment_record()
    assert record["packages"]["torch"] == torch.__version__
    assert record["packages"]["numpy"] == numpy.__version__ and record["packages"]["scikit-learn"] == sklearn.__version__
    assert record["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability() and record["cpu"]
    path = write_environment(tmp_path)
    assert path == tmp_path / ENVIRONMENT and json.loads(path.read_text()) == record


def test_a_missing_distribution_is_recorded_as_none(monkeypatch):
    import score_lightning.glue.environment as E

    monkeypatch.setattr(E, "PACKAGES", ("torch", "surely-not-installed-dist"))
    assert E.environment_record()["packages"] == {"torch": torch.__version__, "surely-not-installed-dist": None}
