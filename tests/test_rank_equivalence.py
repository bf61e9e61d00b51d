"""Data parallelism computes the same update as one process: 2 CPU processes (DDP, and FSDP2 through
``ModelParallelStrategy``) end with the weights of 1 process on the same global batch.

The scripted engine gives non-zero, varied rewards, so the solver's GRPO gradient, the global token
mean, the mini-batch split, the one broadcast rubric and its REINFORCE update all carry signal;
a random model earning 0 everywhere would make this comparison vacuous.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from helpers import FAST, ROOT, read_scalars

COMMON = FAST + [
    # 4 queries, 2 per PPO mini-batch: 2 optimiser steps per SCORE step, each over the same global queries
    "rollout=scripted", "data.batch_size=4", "optim.mini_batch_size=2", "solver.num_rollouts=3",
    "optim.micro_batch_size=3", "solver.max_response_tokens=200", "evaluator.max_response_tokens=400",
    "evaluator.max_rubric_tokens=160", "trainer.max_steps=2", "optim.lr=1e-4", "optim.warmup_steps=0",
    "harness.every_n_steps=10", "callbacks.model_checkpoint.every_n_steps=100",
]


def _train(out, extra: list[str]) -> dict[str, torch.Tensor]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    cmd = [sys.executable, "src/train.py", *COMMON, f"paths.output_dir={out}", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return load_file(next((out / "export").glob("*.safetensors")))


@pytest.fixture(scope="module")
def single(tmp_path_factory, tiny_ckpt, corpus_file):
    out = tmp_path_factory.mktemp("single")
    return out, _train(out, ["strategy=single"])


@pytest.mark.multiprocess  # two or more training processes: make test-multiprocess (CI runs it)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_match_one_process(tmp_path, single, tiny_ckpt, strategy):
    out1, w1 = single
    scalars = read_scalars(out1 / "tensorboard")
    assert min(v for _, v in scalars["solver/reward_std"]) > 0, "rewards must vary within the step"
    start = load_file(next(tiny_ckpt.glob("*.safetensors")))
    moved = max(float((w1[k] - start[k]).abs().max()) for k in w1)
    assert moved > 1e-4, "the updates did not move the weights: the comparison would be vacuous"
    w2 = _train(tmp_path / strategy, [f"strategy={strategy}", "trainer.devices=2"])
    assert w1.keys() == w2.keys()
    worst = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
    assert worst < 1e-5, f"{strategy} on 2 processes differs from 1 process by {worst:.2e} (moved {moved:.2e})"
    print(f"{strategy}: max |w2 - w1| = {worst:.2e}, max |w1 - w0| = {moved:.2e}")
    # the same single rubric (rank 0's, broadcast) was trained on both sides
    s2 = read_scalars(tmp_path / strategy / "tensorboard")
    for tag in ("evaluator/rubric_logprob", "solver/reward_mean", "evaluator/consistency"):
        assert [v for _, v in s2[tag]] == pytest.approx([v for _, v in scalars[tag]], rel=1e-5, abs=1e-5), tag


POINTWISE = ["evaluator.scoring=pointwise", "evaluator.show_retrieved=true"]


@pytest.mark.multiprocess  # two or more training processes: make test-multiprocess (CI runs it)
def test_pointwise_scoring_on_two_processes_matches_one_process(tmp_path, tiny_ckpt):
    """``evaluator.scoring=pointwise`` (one evaluation per report, each rank scoring its own queries' reports):
    DDP on 2 processes ends with the weights and scalars of 1 process."""
    w1 = _train(tmp_path / "single", ["strategy=single", *POINTWISE])
    scalars = read_scalars(tmp_path / "single" / "tensorboard")
    assert min(v for _, v in scalars["solver/reward_std"]) > 0, "rewards must vary within the step"
    assert [v for _, v in scalars["evaluator/report_scores_valid_rate"]] == [1.0, 1.0]
    w2 = _train(tmp_path / "ddp", ["strategy=ddp", "trainer.devices=2", *POINTWISE])
    worst = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
    assert worst < 1e-5, f"pointwise ddp on 2 processes differs from 1 process by {worst:.2e}"
    s2 = read_scalars(tmp_path / "ddp" / "tensorboard")
    for tag in ("solver/reward_mean", "evaluator/verification_depth_mean", "evaluator/scoring_valid_rate",
                "evaluator/incomplete_rate"):
        assert [v for _, v in s2[tag]] == pytest.approx([v for _, v in scalars[tag]], rel=1e-5, abs=1e-5), tag


VARIANT_OPTIONS = ["optim.scale_rewards=batch", "reward.overlong.enabled=true", "reward.overlong.buffer_len=150",
                   "solver.mask_truncated=true"]


@pytest.mark.multiprocess  # two or more training processes: make test-multiprocess (CI runs it)
@pytest.mark.parametrize("loss_type", ["bnpo", "dr_grpo", "dapo", "gspo", "cispo", "grpo_seq_mean"])
def test_each_loss_variant_on_two_processes_matches_one_process(tmp_path, tiny_ckpt, loss_type):
    """The counts behind each ``optim.loss_type``'s normaliser (tokens of the mini-batch or the step, sequences,
    trajectories) and the batch std of ``optim.scale_rewards=batch`` are summed over ranks: DDP on 2 processes
    ends with the weights of 1 process. (bnpo's micro-batches are the same on both sides here: one query's 3
    rows each.)"""
    extra = [f"optim.loss_type={loss_type}", *VARIANT_OPTIONS]
    w1 = _train(tmp_path / "single", ["strategy=single", *extra])
    w2 = _train(tmp_path / "ddp", ["strategy=ddp", "trainer.devices=2", *extra])
    worst = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
    assert worst < 1e-5, f"{loss_type} on 2 DDP processes differs from 1 process by {worst:.2e}"
    s1, s2 = read_scalars(tmp_path / "single" / "tensorboard"), read_scalars(tmp_path / "ddp" / "tensorboard")
    for tag in ("solver/objective", "solver/overlong_penalty"):
        assert [v for _, v in s2[tag]] == pytest.approx([v for _, v in s1[tag]], rel=1e-5, abs=1e-6), tag
