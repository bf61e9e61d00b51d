"""Logs that say only what happened (issue 72): a tag with no value at a step is absent from every logger at that
step, and a default run and its resume print none of the library noise, each path that made it taken for real."""

from __future__ import annotations

import ast
import csv
import inspect
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, read_scalars

#: what a default tiny run and its resume printed before issue 72; each is checked against a run that took its path
NOISE = ("`weights_only` was not set", "Building index from tokens", "fontManager", "font cache",
         "exists and is not empty", "Previous log files in this directory will be deleted")
STEP_LINE = re.compile(r"SCORE step (\d+) done: .* consistency=(\S+) ")


def _train(tmp: Path, extra: list[str]) -> str:
    """``src/train.py`` as a user runs it (tiny_score defaults), stdout and stderr together."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1", MPLCONFIGDIR=str(tmp / "mpl"))
    cmd = [sys.executable, "src/train.py", "experiment=tiny_score", "logger=[tensorboard,csv]", "threads.num=1",
           f"paths.log_dir={tmp / 'logs'}", f"retriever.index_dir={tmp / 'bm25'}",
           "callbacks.collapse_guard.window=1", *extra]  # window=1: a new best, so best.ckpt, at the first step
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600,
                          env=env)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return proc.stdout


@pytest.fixture(scope="module")
def default_run(tmp_path_factory, tiny_ckpt):
    """A fresh 3-step run with a new matplotlib config and a new BM25 index, then ``ckpt_path=last`` to step 4."""
    tmp = tmp_path_factory.mktemp("quiet")
    fresh = _train(tmp, ["trainer.max_steps=3"])
    run = next((tmp / "logs" / "tiny_score").iterdir())
    assert (run / "csv" / "sft").is_dir()  # the cold start's sub-run: why Lightning's CSV writer warned
    assert (run / "checkpoints" / "best.ckpt").exists()  # the collapse guard saved (weights_only left unset before)
    assert list((tmp / "mpl").glob("fontlist-*.json"))  # matplotlib built its font cache in this run
    assert (tmp / "bm25").is_dir()  # and the BM25 index was built, not loaded
    resumed = _train(tmp, ["ckpt_path=last", "trainer.max_steps=4"])
    return fresh, resumed, run


def test_a_tag_with_no_value_at_a_step_is_absent_there_in_every_logger(default_run):
    fresh, resumed, run = default_run
    console = {int(s): float(c) for s, c in STEP_LINE.findall(fresh + resumed)}
    assert sorted(console) == [0, 1, 2, 3]
    valued = sorted(s for s, c in console.items() if math.isfinite(c))
    assert len(valued) < 4, f"every step had a consistency {console}: the case is not exercised on this machine"
    tb = read_scalars(run / "tensorboard")
    assert sorted(s for s, _ in tb["evaluator/consistency"]) == valued  # not the previous value carried forward
    rows = list(csv.DictReader(open(run / "csv" / "metrics.csv", newline="")))
    assert sorted(int(r["step"]) for r in rows if r.get("solver/reward_mean")) == [0, 1, 2, 3]  # resume appended
    assert sorted(int(r["step"]) for r in rows if r.get("evaluator/consistency")) == valued
    for step, value in console.items():  # the console and the loggers agree
        if step in valued:
            assert dict(tb["evaluator/consistency"])[step] == pytest.approx(value, abs=5e-4)


def test_a_default_run_and_its_resume_print_no_library_noise(default_run):
    fresh, resumed, _ = default_run
    for name, output in (("fresh run", fresh), ("resume", resumed)):
        found = [line for line in output.splitlines() if any(n in line for n in NOISE)]
        assert not found, f"{name}: {found}"
    assert [int(s) for s, _ in STEP_LINE.findall(fresh)] == [0, 1, 2]
    assert [int(s) for s, _ in STEP_LINE.findall(resumed)] == [3]


def test_each_filtered_message_is_still_the_library_text():
    """The filters match by exact message: if a library rewords one, this fails instead of the noise returning."""
    import bm25s
    import lightning.pytorch.callbacks.model_checkpoint as model_checkpoint
    import lightning.pytorch.trainer.connectors.checkpoint_connector as checkpoint_connector
    import matplotlib.font_manager as font_manager

    from score_lightning.telemetry.console import QUIET_RECORDS, RESUME_CHECKPOINT_DIR_WARNING

    def literals(module) -> list[str]:
        return [n.value for n in ast.walk(ast.parse(inspect.getsource(module)))
                if isinstance(n, ast.Constant) and isinstance(n.value, str)]

    sources = {"bm25s": bm25s, "matplotlib.font_manager": font_manager,
               "lightning.pytorch.trainer.connectors.checkpoint_connector": checkpoint_connector}
    for name, messages in QUIET_RECORDS.items():
        assert sources[name].__name__ == name  # the filter sits on the logger the library logs to
        for message in messages:
            assert message in literals(sources[name]), (name, message)
    joined = inspect.getsource(model_checkpoint)
    assert 'f"Checkpoint directory {dirpath} exists and is not empty."' in joined
    assert re.match(RESUME_CHECKPOINT_DIR_WARNING, "Checkpoint directory /r/checkpoints exists and is not empty.")
    assert not re.match(RESUME_CHECKPOINT_DIR_WARNING, "Checkpoint directory /r exists and is not empty. Also x")
