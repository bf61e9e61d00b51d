"""Checkpoint files carry names a user types: ``checkpoints/step-000050.ckpt`` beside ``last.ckpt``."""

from __future__ import annotations

import torch

from score_lightning.callbacks.checkpoint import ScoreCheckpoint


def test_a_step_checkpoint_is_named_by_its_step_alone(tmp_path):
    cb = ScoreCheckpoint(dirpath=str(tmp_path), every_n_steps=10)
    name = cb.format_checkpoint_name({"step": torch.tensor(50)})
    assert name.endswith("/step-000050.ckpt"), name  # Lightning's default would write step-step=000050.ckpt
    assert cb.format_checkpoint_name({"step": torch.tensor(50)}, filename="last").endswith("/last.ckpt")
