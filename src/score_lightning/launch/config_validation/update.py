"""The loss, the optimiser and its batches: what the update computes and how much of it reaches the weights."""

from __future__ import annotations

from score_lightning.launch.config_validation.values import BOOL, Checks, integer, number
from score_lightning.launch.config_validation.topology import data_parallel_size


def check_update(c: Checks) -> None:
    c("loss.kl_coef", number(0.0), "a number >= 0")
    c("loss.clip_ratio_low", number(0.0, 1.0, hi_open=True), "a number in [0, 1)")
    c("loss.clip_ratio_high", number(0.0), "a number >= 0")
    c("loss.entropy_coef", number(0.0), "a number >= 0")
    c("loss.norm_adv_by_std", *BOOL)
    c("optim.lr", number(0.0, lo_open=True), "a number > 0")
    c("optim.eps", number(0.0, lo_open=True), "a number > 0")
    c("optim.warmup_steps", integer(0), "an integer >= 0")
    c("optim.warmup_start_ratio", number(0.0, 1.0), "a number in [0, 1]")
    if c.get("optim.warmup_ratio") is not None:
        c("optim.warmup_ratio", number(0.0, 1.0, hi_open=True), "null or a number in [0, 1) (a share of "
          "trainer.max_steps)")
    c("optim.weight_decay", number(0.0), "a number >= 0")
    c("optim.grad_clip", number(0.0), "a number >= 0 (0 disables clipping)")
    c("optim.ppo_epochs", integer(1), "an integer >= 1")
    c("optim.mini_batch_size", integer(1), "an integer >= 1 (queries per optimiser step)")
    c("optim.micro_batch_size", integer(1), "an integer >= 1 (trajectories per forward/backward)")
    c("optim.max_consecutive_skips", integer(1), "an integer >= 1")
    mb, bs = c.get("optim.mini_batch_size"), c.get("data.batch_size")
    if isinstance(mb, int) and isinstance(bs, int) and mb > bs:
        c.add(f"optim.mini_batch_size={mb}: must be <= data.batch_size={bs}")
    world = data_parallel_size(c.cfg)
    if world > 1 and isinstance(mb, int) and mb % world:
        c.add(f"optim.mini_batch_size={mb}: counts global queries and must be divisible by the {world} "
              "data-parallel processes")
