"""GPU-only checks (skipped without CUDA): the scale path on one device."""

from __future__ import annotations

import subprocess

import pytest

from helpers import ROOT


@pytest.mark.gpu
def test_gpu_check_script_runs():
    proc = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "| hf |" in proc.stdout
