"""``rollout=vllm rollout.evaluator_engine=hf``: the solver samples on vLLM, the shared actor's evaluator role on HF.

The expected readout (``evaluator.score_readout=expected``) reads the masked value distribution from the HF
fast-forward decoder; vLLM raises on it (its logprobs are the sampled tokens' top-k). So a run that scores
with the expected readout and finishes proves the scoring pass ran on HF, while the solver's rollouts carry
vLLM's log-probs. Checked synchronously (the callback's engines) and asynchronously (the worker's).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from helpers import ROOT, read_scalars
import vllm_fixtures  # noqa: F401 - sets the engine's environment before vllm is imported

pytestmark = pytest.mark.vllm


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_solver_on_vllm_scores_with_the_expected_readout_on_hf(tmp_path, cache_dir, mode):
    out = tmp_path / "run"
    cmd = [sys.executable, "src/train.py", "experiment=tiny_score", "rollout=vllm", f"rollout.mode={mode}",
           "rollout.evaluator_engine=hf", "evaluator.score_readout=expected", "rollout.enforce_eager=true",
           "trainer.max_steps=2", f"paths.cache_dir={cache_dir}", f"paths.output_dir={out}",
           "trainer.enable_progress_bar=false"]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    if mode == "sync":
        assert re.search(r"rollout engine: vLLM \(started in [\d.]+ s\); evaluator engine: HFEngine", text), text[-3000:]
    else:
        assert re.search(r"rollout worker ready \(pid \d+, engine VLLMEngine, .*; evaluator engine HFEngine\)", text), \
            text[-3000:]
    s = read_scalars(out / "tensorboard")
    assert max(v for _, v in s["solver/reward_mean"]) > 0  # reports were valid, so the evaluator scored them
    # the solver's rollouts came from vLLM: its log-probs, compared with the trainer's, are logged
    assert any(tag in s for tag in ("rollout/logprob_diff", "rollout/mismatch_k1")), sorted(s)
