"""``rollout=vllm rollout.mode=async``: the rollout worker owns a vLLM engine of its own (``make test-vllm``).

The trainer holds no vLLM engine; the worker gets the trainable tensors through the shared-memory slots at
each step boundary and loads them into its engine as the synchronous callback does
(``rollout/vllm_weights.py``). Checked: the worker's engine samples from the trainer's weights after a
sync (and not before), and the CLI run of the acceptance trains, logs staleness 1 and exports.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from helpers import FAST, ROOT, compose, read_scalars
import vllm_fixtures  # noqa: F401 - sets the engine's environment before vllm is imported

pytestmark = pytest.mark.vllm

TEXTS = ["How does asyncio schedule coroutines?", "The quick brown fox", "Explain pickle and marshal."]


class _Requests:
    """Stands in for the worker's request queue: keeps what the trainer side sends."""

    def __init__(self):
        self.sent = []

    def put(self, msg):
        self.sent.append(msg)


@pytest.mark.parametrize("trains", ["all", "lora"])
def test_the_workers_vllm_weights_equal_the_trainers_after_a_step_boundary(tiny_ckpt, tokenizer, corpus_file, trains):
    """The trainer's side pushes its trainable tensors into the slots (``RolloutPrefetcher._push_weights``), the
    worker loads them (``WorkerHost.load_weights``; LoRA merged into vLLM's base weights): its vLLM engine's
    greedy tokens then equal the trainer model's, and its sampling log-probs equal the trainer's own, before and
    after the trainer's weights move, and nothing moves before the sync."""
    from omegaconf import OmegaConf

    from score_lightning.policy.lora import iter_merged_params
    from score_lightning.policy.models import load_policy
    from score_lightning.generation.async_worker import WorkerHost, WorkerSpec
    from score_lightning.rollout.engine import SamplingParams
    from score_lightning.rollout.vllm_engine import VLLMEngine
    from score_lightning.step.batching import build_token_batch, policy_logprobs
    from score_lightning.generation.prefetch import RolloutPrefetcher
    from vllm_fixtures import hf_engine

    lora = ["model.lora.enabled=true", "model.lora.r=4", "model.lora.alpha=8"] if trains == "lora" else []
    cfg = compose(FAST + lora + ["rollout=vllm", "rollout.mode=async", "rollout.enforce_eager=true",
                                 "rollout.max_model_len=2048", "rollout.dtype=float32"])
    t0 = time.perf_counter()
    host = WorkerHost(WorkerSpec(OmegaConf.to_container(cfg, resolve=True), str(tiny_ckpt), str(tiny_ckpt), 1,
                                 os.getpid()))
    print(f"\nworker host with its vLLM engine built in {time.perf_counter() - t0:.1f} s")
    try:
        engines = host.generator
        assert isinstance(engines.engine, VLLMEngine) and engines.evaluator_engine is engines.engine  # shared actor
        trainer = load_policy(str(tiny_ckpt), "float32", lora=cfg.model.get("lora")).eval()  # the trainer's policy
        trainable = {n: p for n, p in trainer.named_parameters() if p.requires_grad}
        assert trains == "all" or all("lora_" in n for n in trainable)
        prefetch = RolloutPrefetcher(cfg, str(tiny_ckpt), str(tiny_ckpt))
        prefetch.requests = _Requests()
        module = SimpleNamespace(policy=trainer, evaluator_policy=None)
        prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
        greedy = SamplingParams(max_new_tokens=24, temperature=0.0)
        hf = hf_engine(trainer, tokenizer)

        def boundary(version: int) -> None:  # what submit() does, then what the worker does with the request
            assert prefetch._push_weights(module, version)
            kind, slots = prefetch.requests.sent[0]
            assert kind == "slots" and set(slots["solver"]) == set(trainable)  # only what the optimiser moves
            host.slots = slots
            host.load_weights()

        def check_logprobs() -> None:
            torch.manual_seed(0)
            gens = host.generator.engine.generate(prompts, SamplingParams(max_new_tokens=24, temperature=1.0))
            batch = build_token_batch(prompts, [g.token_ids for g in gens], [[1] * len(g.token_ids) for g in gens],
                                      tokenizer.pad_token_id)
            with torch.no_grad():
                old, _ = policy_logprobs(trainer, batch, 1.0)
            diffs = [abs(float(old[i, len(p) - 1 + j]) - lp) for i, (p, g) in enumerate(zip(prompts, gens))
                     for j, lp in enumerate(g.logprobs)]
            print(f"worker vLLM vs trainer log-probs: mean |diff| {sum(diffs) / len(diffs):.2e}, max {max(diffs):.2e}")
            assert sum(diffs) / len(diffs) < 1e-3 and max(diffs) < 1e-2

        boundary(0)
        before = [g.token_ids for g in host.generator.engine.generate(prompts, greedy)]
        assert before == [g.token_ids for g in hf.generate(prompts, greedy)]
        check_logprobs()
        gen = torch.Generator().manual_seed(1234)
        with torch.no_grad():  # the update of step 0
            for p in trainable.values():
                p.add_((0.05 if trains == "all" else 0.3) * torch.randn(p.shape, generator=gen))
        assert [g.token_ids for g in engines.engine.generate(prompts, greedy)] == before  # nothing moves before a sync
        boundary(1)
        after = [g.token_ids for g in host.generator.engine.generate(prompts, greedy)]
        assert after == [g.token_ids for g in hf.generate(prompts, greedy)] and after != before
        check_logprobs()
        assert host.last_sync_s > 0 and host.vllm.last_sync_tensors == sum(1 for _ in iter_merged_params(trainer))
    finally:
        host.vllm.close()


def test_cli_trains_tiny_score_with_vllm_in_the_async_worker(tmp_path, cache_dir):
    """The acceptance run: ``experiment=tiny_score rollout=vllm rollout.mode=async`` from the packaged cold start,
    3 SCORE steps: staleness 1 after step 0, non-zero rewards, the IS correction on vLLM's log-probs, an export;
    the worker keeps its thread share with vLLM inside it, and the trainer builds no vLLM engine."""
    out = tmp_path / "run"
    cmd = [sys.executable, "src/train.py", "experiment=tiny_score", "rollout=vllm", "rollout.mode=async",
           "rollout.enforce_eager=true", "trainer.max_steps=3", f"paths.cache_dir={cache_dir}",
           f"paths.output_dir={out}", "trainer.enable_progress_bar=false"]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT / "src"))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    print(f"\n3 tiny_score steps, vLLM in the async worker: {time.perf_counter() - t0:.1f} s")
    s = read_scalars(out / "tensorboard")
    assert [(step, v) for step, v in s["rollout/staleness_max"]] == [(0, 0.0), (1, 1.0), (2, 1.0)]
    assert max(v for _, v in s["solver/reward_mean"]) > 0
    assert [step for step, _ in s["rollout/is_weight_mean"]] == [0, 1, 2]  # optim.rollout_correction=auto is on
    assert abs(s["rollout/mismatch_k1"][0][1]) < 1e-2  # step 0: vLLM's mu and the trainer's pi_old, same weights
    assert list((out / "export").glob("*.safetensors"))
    started = re.search(r"rollout worker started \(pid \d+, (\d+) CPU thread", text)
    ready = re.search(r"rollout worker ready \(pid \d+, engine VLLMEngine, (\d+) CPU thread", text)
    assert started and ready and started.group(1) == ready.group(1), text[-4000:]
    assert "rollout engine: vLLM" not in text  # the synchronous callback built nothing in the trainer
