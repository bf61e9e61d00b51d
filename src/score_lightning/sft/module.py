"""The supervised cold-start ``LightningModule``: masked next-token cross-entropy on demonstrations.

Only response tokens the model itself would write are trained (mask 1); prompts, observations and
padding are not. The loss is a token mean over the batch. Logits are computed only at the trained
positions (hidden states are gathered before the LM head), which on the tiny CPU model roughly
halves the cost: most of each sequence is prompt.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, Sampler

from score_lightning.batching import TokenBatch, build_token_batch
from score_lightning.sft.demos import Demo


class DemoDataset(Dataset):
    def __init__(self, demos: Sequence[Demo]):
        self.demos = list(demos)

    def __len__(self) -> int:
        return len(self.demos)

    def __getitem__(self, i: int) -> Demo:
        return self.demos[i]


class LengthGroupedBatchSampler(Sampler[list[int]]):
    """Shuffled batches of similar length (less padding), reshuffled every epoch, seeded.

    Indices are shuffled, cut into chunks of ``batch_size * group`` sorted by length, split into
    batches, and the batches shuffled again, as ``group_by_length`` samplers do.
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, seed: int = 0, group: int = 8):
        self.lengths = list(lengths)
        self.batch_size = max(1, int(batch_size))
        self.seed = int(seed)
        self.group = max(1, int(group))
        self.epoch = 0

    def __len__(self) -> int:
        return math.ceil(len(self.lengths) / self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        rng = random.Random(f"{self.seed}-{self.epoch}")
        self.epoch += 1
        idx = list(range(len(self.lengths)))
        rng.shuffle(idx)
        chunk = self.batch_size * self.group
        batches = []
        for s in range(0, len(idx), chunk):
            part = sorted(idx[s : s + chunk], key=lambda i: self.lengths[i])
            batches.extend(part[j : j + self.batch_size] for j in range(0, len(part), self.batch_size))
        rng.shuffle(batches)
        return iter(batches)


def collate_demos(demos: Sequence[Demo], pad_id: int) -> TokenBatch:
    return build_token_batch([d.prompt_ids for d in demos], [d.response_ids for d in demos],
                             [d.response_mask for d in demos], pad_id)


def make_loader(demos: Sequence[Demo], batch_size: int, pad_id: int, seed: int = 0) -> DataLoader:
    sampler = LengthGroupedBatchSampler([d.num_tokens for d in demos], batch_size, seed)
    return DataLoader(DemoDataset(demos), batch_sampler=sampler, collate_fn=lambda ds: collate_demos(ds, pad_id),
                      num_workers=0)


def masked_lm_loss(model: nn.Module, batch: TokenBatch) -> tuple[Tensor, Tensor, int]:
    """Token-mean cross-entropy (and accuracy) over the positions where ``batch.loss_mask`` is 1.

    Uses ``model.get_decoder()`` + ``model.get_output_embeddings()`` when the model has them, so
    logits are only formed at trained positions; otherwise a plain forward.
    """
    targets_all = batch.input_ids[:, 1:]
    sel = batch.loss_mask > 0
    n = int(sel.sum())
    if n == 0:
        zero = next(model.parameters()).sum() * 0.0
        return zero, zero.detach(), 0
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if decoder is not None and head is not None:
        hidden = decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).last_hidden_state
        logits = head(hidden[:, :-1][sel]).float()
    else:
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
        logits = out.logits[:, :-1][sel].float()
    targets = targets_all[sel]
    loss = F.cross_entropy(logits, targets, reduction="mean")
    acc = (logits.detach().argmax(-1) == targets).float().mean()
    return loss, acc, n


class SFTModule(LightningModule):
    """AdamW with linear warmup and cosine decay to ``min_lr_ratio``; logs ``sft/loss`` and ``sft/token_acc``."""

    def __init__(self, model: nn.Module, lr: float = 2e-3, weight_decay: float = 0.0, betas=(0.9, 0.98),
                 warmup_steps: int = 20, max_steps: int = 1000, min_lr_ratio: float = 0.1, grad_clip: float = 1.0):
        super().__init__()
        self.model = model
        self.lr = float(lr)
        self.weight_decay = float(weight_decay)
        self.betas = tuple(float(b) for b in betas)
        self.warmup_steps = int(warmup_steps)
        self.max_steps = max(1, int(max_steps))
        self.min_lr_ratio = float(min_lr_ratio)
        self.grad_clip = float(grad_clip)
        self.tokens_seen = 0

    def lr_factor(self, step: int) -> float:
        if self.warmup_steps > 0 and step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        span = max(1, self.max_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def configure_optimizers(self):
        opt = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=self.lr,
                                betas=self.betas, weight_decay=self.weight_decay)
        sch = torch.optim.lr_scheduler.LambdaLR(opt, self.lr_factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sch, "interval": "step"}}

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)

    def training_step(self, batch: TokenBatch, batch_idx: int) -> Tensor:
        loss, acc, n = masked_lm_loss(self.model, batch)
        self.tokens_seen += n
        bs = int(batch.input_ids.shape[0])
        self.log("sft/loss", loss.detach(), on_step=True, prog_bar=True, batch_size=bs)
        self.log("sft/token_acc", acc, on_step=True, prog_bar=True, batch_size=bs)
        self.log("sft/lr", self.lr * self.lr_factor(self.global_step), on_step=True, batch_size=bs)
        self.log("sft/trained_tokens", float(self.tokens_seen), on_step=True, batch_size=bs)
        return loss

    def transfer_batch_to_device(self, batch, device, dataloader_idx: int):
        return batch.to(device) if isinstance(batch, TokenBatch) else super().transfer_batch_to_device(batch, device, dataloader_idx)
