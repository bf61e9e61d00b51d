"""Every ``bench_learning.py`` condition is a valid recipe: a study lane that reaches a broken one hours into its
run loses the lane's time, so each is composed and validated here, as train.py would before any model loads."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from helpers import ROOT, compose

sys.path.insert(0, str(ROOT / "scripts"))
from bench_learning import CONDITIONS, NO_EVALUATOR  # noqa: E402


@pytest.mark.parametrize("name", sorted(CONDITIONS))
def test_condition_composes_and_validates(name):
    from score_lightning.launch.config_validation import validate_config

    cfg = compose(CONDITIONS[name])
    validate_config(cfg)
    # --evaluator-pairs skips exactly the arms whose reward is a program, not an evaluator's scores
    assert (cfg.reward.get("source") == "rule") == (name in NO_EVALUATOR), (name, cfg.reward.get("source"))


def test_given_items_reads_the_evidence_items_and_given_the_criteria(monkeypatch):
    """The two given-rubric conditions differ in their file only: the evidence items (a binary checklist whose
    items name the passage to cite and the key terms) against the DeepResearch Bench criteria."""
    monkeypatch.setenv("PROJECT_ROOT", str(ROOT))
    items, criteria = compose(CONDITIONS["given_items"]), compose(CONDITIONS["given"])
    paths = [Path(OmegaConf.to_container(c, resolve=True)["rubric"]["path"]) for c in (items, criteria)]
    assert [p.name for p in paths] == ["items.jsonl", "criteria_tiny.jsonl"] and all(p.is_file() for p in paths)
    row = json.loads(paths[0].read_text().splitlines()[0])
    assert all(r["type"] == "binary" and r["evidence"] and r["terms"] for r in row["rubrics"])
    a = OmegaConf.to_container(items, resolve=False)
    b = OmegaConf.to_container(criteria, resolve=False)
    a["rubric"].pop("path"), b["rubric"].pop("path")
    assert a == b


def _run_dir(tmp_path: Path, stopped_step: int | None) -> Path:
    import torch

    run = tmp_path / "cell"
    (run / "checkpoints").mkdir(parents=True)
    (run / "export").mkdir()
    (run / "export" / "run_config.json").write_text("{}")
    state = {"stopped_reason": "reward rise-then-fall" if stopped_step is not None else None,
             "stopped_step": stopped_step}
    torch.save({"callbacks": {"CollapseGuard{'monitor_entropy': 'solver/entropy'}": state}},
               run / "checkpoints" / "last.ckpt")
    return run


def test_a_run_the_collapse_guard_stopped_stays_stopped_at_every_later_horizon(tmp_path, monkeypatch):
    """The guard stopped the run at step 51 on its way to 80: neither horizon trains again, and both keep the export
    of the stop (a resumed process would train past it). A run it never stopped trains to each horizon in turn."""
    import study_cells

    calls = []
    monkeypatch.setattr(study_cells, "run_logged", lambda cmd, log, threads=None: calls.append(cmd))
    run = _run_dir(tmp_path / "stopped", 51)
    assert study_cells.guard_stop(run) == 51
    exports = study_cells.train_horizons(["experiment=tiny_score"], 61, [80, 160], run)
    assert calls == [] and sorted(exports) == [80, 160]
    assert all((e / "run_config.json").is_file() for e in exports.values())
    assert "stopped this run at step 51" in (run / "train.log").read_text()

    run = _run_dir(tmp_path / "running", None)
    assert study_cells.guard_stop(run) is None and study_cells.guard_stop(tmp_path / "empty") is None
    study_cells.train_horizons(["experiment=tiny_score"], 61, [80, 160], run)
    assert [next(a for a in c if a.startswith("trainer.max_steps=")) for c in calls] == [
        "trainer.max_steps=80", "trainer.max_steps=160"]
