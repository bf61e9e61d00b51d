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
