"""The weight digest of a golden run (scripts/golden_runs.py), a Lightning callback given on the command line:
``+callbacks.golden_digest._target_=golden_digest.WeightDigest +callbacks.golden_digest.path=<file>``.

It reads the trained module through Lightning's hooks only (``named_parameters``, ``requires_grad``), so it keeps
working whatever the package's layout: the trainable tensors at the start of fit against those at its end.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from lightning.pytorch import Callback


class WeightDigest(Callback):
    """Per trainable tensor: the sha256 of its final bytes, and the float64 sum and L2 norm of final - initial
    (the deltas carry the training; against the weights themselves a ~1e-4 step would vanish in any tolerance)."""

    def __init__(self, path: str):
        self.path, self.start = Path(path), {}

    def on_train_start(self, trainer, pl_module) -> None:
        self.start = {n: p.detach().to("cpu", copy=True) for n, p in pl_module.named_parameters() if p.requires_grad}

    def on_train_end(self, trainer, pl_module) -> None:
        digest = {}
        for name, p in pl_module.named_parameters():
            if name in self.start:
                final = p.detach().to("cpu").contiguous()
                delta = final.double() - self.start[name].double()
                digest[name] = {"shape": list(final.shape),
                                "sha256": hashlib.sha256(final.reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest(),
                                "delta_sum": float(delta.sum()), "delta_l2": float(delta.norm())}
        if trainer.is_global_zero:
            self.path.write_text(json.dumps(digest, sort_keys=True, indent=1))
