"""The one-GPU check (``scripts/gpu_check.sh``): GPU-only (skipped without CUDA), plus its report logic on CPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "scripts"))


@pytest.mark.gpu
def test_gpu_check_script_runs():
    proc = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "| fsdp2-bf16-hf | passed |" in proc.stdout
    for part in ("lora", "vllm"):  # each is reported, never left out
        assert any(line.startswith(f"| {part} | ") for line in proc.stdout.splitlines()), part


def test_gpu_check_reports_every_part_and_fails_on_any_failure(tmp_path: Path, monkeypatch):
    """Without a GPU: a missing package is "not installed", an absent config key "not available", a
    crashing run "failed" (exit 1); nothing disappears from the report."""
    import gpu_check as G

    monkeypatch.setattr(G, "build_checkpoint", lambda cache, cpu: tmp_path / "ckpt")
    monkeypatch.setattr(G, "has_config_key", lambda overrides, key: False)
    real_find_spec = G.importlib.util.find_spec
    monkeypatch.setattr(G.importlib.util, "find_spec",
                        lambda name, *a: None if name in ("vllm", "peft") else real_find_spec(name, *a))
    calls = []

    def fake_run(cmd, **kw):  # the HF part "crashes" without training
        calls.append(cmd)
        kw["stdout"].write("Traceback: boom\n")
        return subprocess.CompletedProcess(cmd, 1)

    monkeypatch.setattr(G.subprocess, "run", fake_run)
    assert G.main(["--cpu-smoke", "--out", str(tmp_path / "out")]) == 1
    assert len(calls) == 1 and "experiment=qwen_score_1gpu" in calls[0]
    monkeypatch.setattr(G.importlib.util, "find_spec", real_find_spec)
    parts = G.make_parts(G.run_overrides(tmp_path / "ckpt", 3, cpu=True), tmp_path / "out")
    parts[1].requires = None  # lora: has_config_key is patched to False, so "not available"
    parts[2].requires = "a_module_that_is_not_installed"
    for p in parts:
        G.run_part(p, sys.executable, 100.0, 3, tmp_path)
    statuses = {p.name: p.status for p in parts}
    assert statuses == {"fsdp2-bf16-hf": G.FAILED, "lora": G.NOT_AVAILABLE, "vllm": G.NOT_INSTALLED}
    assert "boom" in parts[0].detail
    table = G.report(parts)
    assert all(f"| {p.name} | {p.status} |" in table for p in parts)


def test_gpu_check_shell_wrapper_parses():
    assert subprocess.run(["bash", "-n", "scripts/gpu_check.sh"], cwd=ROOT).returncode == 0
