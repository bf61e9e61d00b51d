"""Real multi-process strategies on CPU (gloo): DDP and FSDP2 run SCORE steps, print each once, and resume."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from helpers import FAST, ROOT, compose, recipe


def _train(out, extra, timeout=600):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    cmd = [sys.executable, "src/train.py", *FAST, "trainer.devices=2", "data.batch_size=2", "optim.mini_batch_size=2",
           f"paths.output_dir={out}", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def _meta(ckpt):
    path = ckpt / "meta.pt" if ckpt.is_dir() else ckpt  # FSDP writes a sharded directory
    return torch.load(path, weights_only=True)


@pytest.mark.multiprocess  # two or more training processes: make test-multiprocess (CI runs it)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_process_run_and_resume(tmp_path, tiny_ckpt, corpus_file, strategy):
    out = tmp_path / strategy
    first = _train(out, [f"strategy={strategy}", "trainer.max_steps=2"])
    steps = re.findall(r"SCORE step (\d+) done", first.stdout + first.stderr)
    assert steps == ["0", "1"], steps  # each step's console line once, from rank 0, not once per rank
    ckpt = out / "checkpoints" / "last.ckpt"
    meta = _meta(ckpt)
    assert meta["global_step"] == 2 and meta["score"]["score_step"] == 2
    assert len(meta["score"]["rng_per_rank"]) == 2  # both ranks' RNG saved for an exact resume
    if strategy == "fsdp":
        assert ckpt.is_dir() and len(list(ckpt.glob("*.distcp"))) == 2  # one shard per rank
    _train(out, [f"strategy={strategy}", "trainer.max_steps=3", f"ckpt_path={ckpt}"])
    meta = _meta(ckpt)
    assert meta["global_step"] == 3 and meta["score"]["score_step"] == 3
    export = list((out / "export").glob("*.safetensors"))
    assert export
    from safetensors.torch import load_file

    weights = load_file(export[0])
    assert "model.layers.0.self_attn.q_proj.weight" in weights  # HF names, no wrapper prefixes


def test_strategy_configs_instantiate():
    from hydra.utils import instantiate
    from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy, SingleDeviceStrategy

    single = instantiate(compose(["strategy=single"]).strategy)
    assert isinstance(single, SingleDeviceStrategy) and single.root_device.type == "cpu"
    ddp = instantiate(compose(["strategy=ddp", "trainer.devices=2"]).strategy)
    assert isinstance(ddp, DDPStrategy) and ddp._ddp_kwargs == {"find_unused_parameters": False}
    separate = instantiate(compose(["strategy=ddp", "trainer.devices=2", "actor.shared=false"]).strategy)
    assert separate._ddp_kwargs == {"find_unused_parameters": True}  # the evaluator model is unused in solver steps
    fsdp = instantiate(compose(["strategy=fsdp", "trainer.devices=2"]).strategy)
    assert isinstance(fsdp, ModelParallelStrategy) and fsdp._data_parallel_size == 2
    qwen = instantiate(compose([*recipe("qwen_score")]).strategy)
    assert isinstance(qwen, ModelParallelStrategy) and qwen._data_parallel_size == 4
    with pytest.raises(Exception, match="strategy.mixed_precision"):
        instantiate(compose(["strategy=fsdp", "strategy.mixed_precision=fp8"]).strategy)
