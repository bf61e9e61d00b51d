"""scripts/bench_async.py: its last line (a 2-step tiny run, under make test-slow; no speedup is asserted) and its
equal-work checks."""

from __future__ import annotations

import copy
import re
import subprocess
import sys

import pytest

from helpers import FAST, ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import bench_async  # noqa: E402

LAST_LINE = re.compile(r"^async_speedup_tiny=\d+\.\d{3} async_speedup_smol=n/a staleness_max=1 equal_work=ok engine=hf$")


@pytest.mark.slow  # two full training processes (44 s); make test-slow
def test_two_step_tiny_run_prints_the_summary_line(tmp_path, tiny_ckpt, corpus_file):
    overrides = [f"--override={o}" for o in FAST if not o.startswith("experiment=")]
    proc = subprocess.run([sys.executable, "scripts/bench_async.py", "--steps", "2", "--smol", "off", "--out",
                           str(tmp_path), *overrides], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert LAST_LINE.match(lines[-1]), lines[-1]
    report = next(line for line in lines if line.startswith("tiny_score rep 1/1:"))
    assert "generated tokens" in report and "threads sync 2, async 1 + worker 1" in report
    assert "smol_score skipped: --smol off" in proc.stdout


def _record(mode: str) -> dict:
    steps = [{"t": float(i), "step": i, "ids": [str(i)], "tokens": 10.0, "staleness_max": float(i > 0)}
             for i in range(3)]
    return {"steps": steps, "threads": 2 if mode == "sync" else 1, "worker_threads": 0 if mode == "sync" else 1,
            "config": {"rollout": {"mode": mode, "engine": "hf"}, "solver": {"max_response_tokens": 384},
                       "callbacks": {"bench_timer": {"path": f"/x/{mode}.json"}}}}


def test_equal_work_is_checked_not_assumed():
    sync, asyn = _record("sync"), _record("async")
    assert bench_async.equal_work_problems(sync, asyn) == []  # only rollout.mode and the timer's file differ
    vl_sync, vl_async = copy.deepcopy(sync), copy.deepcopy(asyn)  # rollout=vllm: its callback copies the mode
    for rec, mode in ((vl_sync, "sync"), (vl_async, "async")):
        rec["config"]["callbacks"]["vllm_rollout"] = {"rollout_cfg": {"mode": mode, "max_batch_size": 16}}
    assert bench_async.equal_work_problems(vl_sync, vl_async) == []
    vl_async["config"]["callbacks"]["vllm_rollout"]["rollout_cfg"]["max_batch_size"] = 8
    assert bench_async.equal_work_problems(vl_sync, vl_async) == [
        "config callbacks.vllm_rollout.rollout_cfg.max_batch_size: sync 16, async 8"]
    other = copy.deepcopy(asyn)
    other["steps"][1]["ids"] = ["7"]
    assert bench_async.equal_work_problems(sync, other) == ["step 1: sync trained queries ['1'], async ['7']"]
    other = copy.deepcopy(asyn)
    other["config"]["solver"]["max_response_tokens"] = 128
    assert bench_async.equal_work_problems(sync, other) == ["config solver.max_response_tokens: sync 384, async 128"]
    other = copy.deepcopy(asyn)
    other["worker_threads"] = 2
    assert bench_async.equal_work_problems(sync, other) == ["threads: sync 2, async 1 + worker 2"]
    other = copy.deepcopy(asyn)
    other["steps"] = other["steps"][:2]
    assert bench_async.equal_work_problems(sync, other)[0].startswith("steps: sync 3, async 2")
    assert bench_async.timed(sync) == (2.0, 20.0)  # steps 1..N-1: step 0's start-up is not timed


def test_median_step_is_over_the_steps_after_the_first():
    rec = _record("sync")
    rec["steps"] = [{**s, "t": t} for s, t in zip(rec["steps"] * 2, [100.0, 130.0, 150.0, 190.0])]
    assert bench_async.median_step(rec) == 30.0  # durations 30, 20, 40: step 0's start-up (100 s) is not one
