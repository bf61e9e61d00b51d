"""Behaviour unchanged, shown (issue 70): each CPU experiment trains 3 steps at seed 0 on one thread exactly as
recorded in tests/data/golden (every logged scalar, the deltas of the trainable weights; scripts/golden_runs.py),
and a ``last.ckpt`` written before the redesign still resumes. Marked ``golden``: ``make test-golden`` (CI).

The records hold on the machine kind and torch build they were made with (docs/DEVELOPING.md, "Golden runs").
The check's own comparison (tolerance, NaN, a missing step or tensor) is tested without training, in the default
suite, so a check that cannot fail is caught there."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import golden_runs  # noqa: E402

GOLDEN = ROOT / "tests" / "data" / "golden"
#: the checkpoint's run: tiny_score with a smaller from-scratch tiny model (its file stays ~1 MB; README there)
CKPT_RUN = ["experiment=tiny_score", "seed=0", "threads.num=1", "sft.enabled=false", "model.tiny.vocab_size=512",
            "model.tiny.hidden_size=32", "model.tiny.intermediate_size=64", "model.tiny.num_hidden_layers=1",
            "model.tiny.num_attention_heads=1", "model.tiny.num_key_value_heads=1", "logger=csv"]


@pytest.mark.golden
@pytest.mark.parametrize("experiment", golden_runs.EXPERIMENTS)
def test_the_experiment_trains_as_recorded(experiment):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "golden_runs.py"), "--check", "--only", experiment],
                          cwd=ROOT, capture_output=True, text=True, timeout=golden_runs.TIMEOUT_S + 60)
    lines = done.stdout.splitlines()
    assert lines and lines[-1] == "golden_runs=1 ok=1 mismatched=0", done.stdout[-6000:] + done.stderr[-3000:]
    assert done.returncode == 0


@pytest.mark.golden
def test_a_checkpoint_written_before_the_redesign_resumes_for_one_more_step(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    ckpt = GOLDEN / "tiny_score_last.ckpt"
    done = subprocess.run([sys.executable, str(ROOT / "src" / "train.py"), *CKPT_RUN, "trainer.max_steps=3",
                           f"ckpt_path={ckpt}", f"paths.output_dir={tmp_path}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(tmp_path / "csv" / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["step"]) for r in rows] == [2]  # steps 0 and 1 came from the checkpoint; the third ran here
    import torch

    resumed = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert resumed["score"]["score_step"] == 3 and resumed["global_step"] == 3


RECORD = {"scalars": {"solver/loss": [[0, 0.5], [1, float("nan")]], "evaluator/kl": [[0, 0.0]]},
          "weights": {"w": {"shape": [2], "sha256": "a", "delta_sum": 0.01, "delta_l2": 0.02}}}


def _changed(**edits) -> dict:
    got = json.loads(json.dumps(RECORD))
    for path, value in edits.items():
        node = got
        *keys, last = path.split(".")
        for k in keys:
            node = node[int(k)] if isinstance(node, list) else node[k]
        node[int(last) if isinstance(node, list) else last] = value
    return got


def test_the_check_passes_rounding_and_catches_a_behaviour_change():
    record = json.loads(json.dumps(RECORD))
    record["scalars"]["solver/loss"][1][1] = "nan"  # as a record stores it
    same = _changed(**{"scalars.solver/loss.1.1": "nan"})
    assert golden_runs.compare("x", record, same) == []
    rounding = _changed(**{"scalars.solver/loss.1.1": "nan", "scalars.solver/loss.0.1": 0.5 * (1 + 1e-6),
                           "scalars.evaluator/kl.0.1": 5e-9, "weights.w.delta_l2": 0.02 * (1 + 5e-5),
                           "weights.w.sha256": "b"})  # float summation order: passes, the sha256 is informational
    assert golden_runs.compare("x", record, rounding) == []
    moved = _changed(**{"scalars.solver/loss.1.1": "nan", "scalars.solver/loss.0.1": 0.5 * (1 + 1e-3)})
    assert golden_runs.compare("x", record, moved) == ["x/step 0/solver/loss: recorded 0.5 now 0.5005"]
    lr = _changed(**{"scalars.solver/loss.1.1": "nan", "scalars.solver/loss.0.1": 0.5, "scalars.evaluator/kl.0.1": 5e-8})
    assert golden_runs.compare("x", record, lr) == ["x/step 0/evaluator/kl: recorded 0.0 now 5e-08"]  # beyond atol
    weights = _changed(**{"scalars.solver/loss.1.1": "nan", "weights.w.delta_sum": 0.0101})
    assert golden_runs.compare("x", record, weights) == ["x/weights/w/delta_sum: recorded 0.01 now 0.0101"]
    finite = _changed(**{"scalars.solver/loss.1.1": 0.25})
    assert golden_runs.compare("x", record, finite) == ["x/step 1/solver/loss: recorded nan now 0.25"]
    fewer = _changed(**{"scalars.solver/loss": [[0, 0.5]]})
    assert golden_runs.compare("x", record, fewer) == ["x/step 1/solver/loss: recorded nan now absent"]
    new_tag = _changed(**{"scalars.solver/loss.1.1": "nan", "scalars.solver/extra": [[0, 1.0]]})
    assert golden_runs.compare("x", record, new_tag) == ["x/step 0/solver/extra: recorded absent now 1.0"]


def test_time_dependent_scalars_are_left_out_of_a_record(tmp_path):
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "metrics.csv").write_text(
        "epoch,judge/in_flight_max,judge/latency_max_s,solver/loss,step,throughput/tokens_per_s,time/rollout_s\n"
        "0,7.0,0.07,0.5,0,1498.0,0.6\n0,8.0,0.03,nan,1,1500.0,0.5\n")
    assert golden_runs.read_scalars(tmp_path) == {"solver/loss": [[0, 0.5], [1, "nan"]]}


def test_every_cpu_experiment_has_a_record():
    assert {p.stem for p in GOLDEN.glob("*.json")} == set(golden_runs.EXPERIMENTS)
    for name in golden_runs.EXPERIMENTS:
        record = json.loads((GOLDEN / f"{name}.json").read_text())
        assert record["experiment"] == name and record["steps"] == 3 and record["weights"]
        steps = {k: [step for step, _ in v] for k, v in record["scalars"].items() if not k.startswith("sft/")}
        assert steps["solver/reward_mean"] == [0, 1, 2], name  # some scalars are logged on some steps only
        assert all(s == sorted(set(s)) and set(s) <= {0, 1, 2} for s in steps.values()), name
