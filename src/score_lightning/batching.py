"""Trajectories -> padded token tensors, and the trainer-side log-prob computation.

Layout: each row is ``prompt + response`` right-padded. Per-token tensors have length L-1 and are
aligned with the *targets* ``input_ids[:, 1:]``, so position t scores token t+1. ``loss_mask`` is 1
exactly where the target is a model-generated response token (observations and padding are 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor, nn

from score_lightning.losses import entropy_from_logits, token_logprobs


@dataclass
class TokenBatch:
    input_ids: Tensor       # [N, L]
    attention_mask: Tensor  # [N, L]
    loss_mask: Tensor       # [N, L-1] float
    lengths: Tensor         # [N] real (unpadded) lengths

    def rows(self, index: Sequence[int] | Tensor) -> "TokenBatch":
        """A sub-batch, trimmed to its own longest row (no padding to the global maximum)."""
        index = torch.as_tensor(index, dtype=torch.long)
        width = int(self.lengths[index].max())
        return TokenBatch(
            self.input_ids[index, :width],
            self.attention_mask[index, :width],
            self.loss_mask[index, : width - 1],
            self.lengths[index],
        )

    def to(self, device) -> "TokenBatch":
        return TokenBatch(*(t.to(device) for t in (self.input_ids, self.attention_mask, self.loss_mask, self.lengths)))

    @property
    def num_tokens(self) -> int:
        return int(self.loss_mask.sum())


def build_token_batch(
    prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], masks: Sequence[Sequence[int]], pad_id: int
) -> TokenBatch:
    n = len(prompts)
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    width = max(lengths)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    loss_mask = torch.zeros((n, max(width - 1, 1)), dtype=torch.float32)
    for i, (p, r, m) in enumerate(zip(prompts, responses, masks)):
        if len(r) != len(m):
            raise ValueError(f"row {i}: response has {len(r)} ids but mask has {len(m)}")
        seq = list(p) + list(r)
        ids[i, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
        attn[i, : len(seq)] = 1
        if r:
            # target index j (token j+1) belongs to the response when j+1 >= len(p)
            loss_mask[i, len(p) - 1 : len(p) - 1 + len(r)] = torch.as_tensor(m, dtype=torch.float32)
    return TokenBatch(ids, attn, loss_mask, torch.as_tensor(lengths, dtype=torch.long))


def policy_logprobs(
    model: nn.Module, batch: TokenBatch, temperature: float = 1.0, with_entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Per-token log-probs of the targets (and entropy) under ``model``; [N, L-1] each.

    Entropy is detached (a logged statistic) unless ``entropy_grad`` (an entropy bonus in the loss).
    """
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
    logits = out.logits[:, :-1, :].float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = token_logprobs(logits, batch.input_ids[:, 1:])
    ent = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = entropy_from_logits(logits)
    return logp, ent
