"""scripts/bench_step.py: the equal-work checks, in particular for ``--generator own`` (no TRL needed)."""

from __future__ import annotations

import copy
import sys

from helpers import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import bench_step  # noqa: E402


def _ready(forced: int) -> dict[str, dict]:
    ours = {"gradient_checkpointing": False, "stop_ids": [2, 7], "dtype": "torch.float32", "threads": 1,
            "prompt_digest": "p", "malloc": "glibc default", "forced_length": forced, "generator": "HFEngine",
            "rss_mb": 500.0}
    trl = dict(ours, generation_stop_ids=[2, 7], generator="generate")
    return {"ours": ours, "trl": trl}


def _steps(completion: dict[str, list[int]], digests: dict[str, str]) -> dict[str, list[dict]]:
    return {side: [{"rep": i - 1, "prompt_tokens": 100, "prompt_digest": "p", "completion_tokens": n,
                    "completion_digest": digests[side]} for i, n in enumerate(counts)]
            for side, counts in completion.items()}


def test_own_generators_pass_with_equal_forced_counts_and_different_tokens():
    steps = _steps({"ours": [1024, 1024, 1024], "trl": [1024, 1024, 1024]}, {"ours": "aaaa", "trl": "bbbb"})
    assert bench_step.step_problems(steps, forced_tokens=4 * 4 * 64) == []
    assert bench_step.settings_problems(_ready(64), forced_length=64) == []


def test_own_generators_refuse_a_completion_count_mismatch():
    steps = _steps({"ours": [1024, 1024, 1024], "trl": [1024, 1019, 1024]}, {"ours": "a", "trl": "b"})
    assert bench_step.step_problems(steps, forced_tokens=1024) == [
        "step 1 (rep 1): completion_tokens ours 1024 vs TRL 1019",
        "step 1 (rep 1): TRL wrote 1019 completion tokens, forced 1024"]
    # equal on both sides but short of the forced length: some completion stopped early on both
    short = _steps({"ours": [1024, 1000, 1024], "trl": [1024, 1000, 1024]}, {"ours": "a", "trl": "b"})
    assert bench_step.step_problems(short, forced_tokens=1024) == [
        "step 1 (rep 1): ours wrote 1000 completion tokens, forced 1024",
        "step 1 (rep 1): TRL wrote 1000 completion tokens, forced 1024"]
    assert bench_step.step_problems(short) == []  # identical mode: equal counts are enough


def test_a_side_that_does_not_force_the_length_is_refused_before_measuring():
    ready = _ready(64)
    ready["trl"]["forced_length"] = 0
    assert bench_step.settings_problems(ready, forced_length=64) == [
        "forced_length: ours 64 vs TRL 0", "trl: forces completions to 0 tokens, asked 64"]
    assert bench_step.settings_problems(_ready(64)) == [  # identical mode asks for no forcing
        "ours: forces completions to 64 tokens, asked 0", "trl: forces completions to 64 tokens, asked 0"]


def test_refused_pair_prints_refused_and_exits_1(monkeypatch, capsys):
    steps = _steps({"ours": [1024, 1024], "trl": [1024, 1000]}, {"ours": "a", "trl": "b"})
    rec = {"time_s": 1.0, "rollout_s": 0.5, "update_s": 0.5, "prompt_tokens": 100, "completion_tokens": 1024}
    res = {"k": 4, "m": 64, "ready": _ready(64), "timed": {"ours": [rec], "trl": [rec]},
           "done": {"ours": {"peak_rss_mb": 1.0}, "trl": {"peak_rss_mb": 2.0}}, "ratios": [1.0],
           "problems": bench_step.step_problems(steps, 1024), "identical_steps": 0, "steps": 2, "ratio": 1.0,
           "peak_ratio": 0.5}
    monkeypatch.setattr(bench_step, "run_pair", lambda a, **over: copy.deepcopy(res))
    monkeypatch.setattr(bench_step.bc, "checkpoint", lambda model: ROOT)
    try:
        bench_step.main(["--generator", "own"])
    except SystemExit as exc:
        assert exc.code == 1
    else:
        raise AssertionError("a refused pair must exit 1")
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1] == "ratio_vs_trl=refused peak_ratio_vs_trl=refused equal_work=FAILED"
    assert "not required: each side samples its own tokens" in out
    assert "TRL wrote 1000 completion tokens, forced 1024" in out
