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

from score_lightning.policy.logprobs import fusable_head, fused_head_logprobs
from score_lightning.step.losses import entropy_from_logits, token_logprobs
from score_lightning.policy.shared_prefix import mask_form, pack_group, prompt_groups


@dataclass
class TokenBatch:
    input_ids: Tensor       # [N, L]
    attention_mask: Tensor  # [N, L]
    loss_mask: Tensor       # [N, L-1] float
    lengths: Tensor         # [N] real (unpadded) lengths
    prompt_lens: Tensor | None = None  # [N] prompt tokens of each row (None: unknown, no prompt sharing); on the CPU

    def rows(self, index: Sequence[int] | Tensor) -> "TokenBatch":
        """A sub-batch, trimmed to its own longest row (no padding to the global maximum)."""
        index = torch.as_tensor(index, dtype=torch.long)
        width = int(self.lengths[index].max())
        return TokenBatch(
            self.input_ids[index, :width],
            self.attention_mask[index, :width],
            self.loss_mask[index, : width - 1],
            self.lengths[index],
            self.prompt_lens[index] if self.prompt_lens is not None else None,
        )

    def to(self, device) -> "TokenBatch":
        moved = (t.to(device) for t in (self.input_ids, self.attention_mask, self.loss_mask, self.lengths))
        return TokenBatch(*moved, self.prompt_lens)

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
    return TokenBatch(ids, attn, loss_mask, torch.as_tensor(lengths, dtype=torch.long),
                      torch.as_tensor([len(p) for p in prompts], dtype=torch.long))


#: float32 elements of ``[rows, T, V]`` logits processed at once by :func:`policy_logprobs`
#: (64 Mi floats = 256 MiB); bounds the float32 upcast of bf16 logits and the log-softmax temporaries.
_CHUNK_ELEMENTS = 1 << 26


def _accepts_logits_to_keep(model: nn.Module) -> bool:
    import inspect

    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover - exotic wrappers
        return False


def policy_logprobs(
    model: nn.Module, batch: TokenBatch, temperature: float = 1.0, with_entropy: bool = False,
    entropy_grad: bool = False, *, fused: bool = True, chunk: int | None = None, share_prompt: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Per-token log-probs of the targets (and entropy) under ``model``; [N, L-1] each.

    Entropy is detached (a logged statistic) unless ``entropy_grad`` (an entropy bonus in the loss).

    Only positions from the first response target on are projected through the LM head
    (``logits_to_keep``): prompt positions never carry loss, and with long prompts their
    ``[N, T, V]`` logits, log-softmax and backward dominated the step. Columns before that are
    returned as 0 (they are always masked).

    ``fused`` (the default) computes log-probs and entropy from the final hidden states ``chunk``
    positions at a time, recomputed in backward (:mod:`score_lightning.policy.logprobs`), so the
    ``[N, T, V]`` logits never exist at once; a head it cannot reproduce exactly (LoRA-wrapped,
    soft-capped) falls back to the plain path, which materialises them (``fused=False``).

    ``share_prompt`` runs each group of rows with one prompt as one packed row
    (:mod:`score_lightning.policy.shared_prefix`) when the batch knows its prompt lengths, some rows share
    a prompt and the attention implementation reads a custom mask; the values are the same.
    """
    if share_prompt:
        packed = _shared_prompt_logprobs(model, batch, temperature, with_entropy, entropy_grad, fused, chunk)
        if packed is not None:
            return packed
    n, width = batch.input_ids.shape
    if width < 2:
        z = batch.input_ids.new_zeros((n, max(width - 1, 1)), dtype=torch.float32)
        return z, (z.clone() if with_entropy else None)
    cols = batch.loss_mask.shape[1]  # == width - 1
    nz = torch.nonzero(batch.loss_mask.sum(dim=0) > 0)
    start = int(nz[0]) if nz.numel() else cols - 1
    labels = batch.input_ids[:, start + 1:]
    head = fusable_head(model) if fused else None
    if head is not None:
        with fused_head_logprobs(head, labels, temperature, with_entropy, entropy_grad, chunk):
            packed = _forward(model, batch, start, cols)
        if packed.shape[:2] != labels.shape:
            raise RuntimeError(f"fused LM head returned {tuple(packed.shape)} for labels {tuple(labels.shape)}")
        logp, ent = packed[..., 0], (packed[..., 1] if with_entropy else None)
        if ent is not None and not (entropy_grad and torch.is_grad_enabled()):
            ent = ent.detach()
    else:
        logp, ent = _plain_logprobs(_forward(model, batch, start, cols), labels, temperature, with_entropy,
                                    entropy_grad)
    logp = torch.nn.functional.pad(logp, (start, 0))
    ent = torch.nn.functional.pad(ent, (start, 0)) if ent is not None else None
    return logp, ent


def _shared_prompt_logprobs(model: nn.Module, batch: TokenBatch, temperature: float, with_entropy: bool,
                            entropy_grad: bool, fused: bool, chunk: int | None) -> tuple[Tensor, Tensor | None] | None:
    """:func:`policy_logprobs` with one packed forward per prompt group; ``None`` where it does not apply."""
    form = mask_form(model)
    if batch.prompt_lens is None or form is None or not _accepts_logits_to_keep(model):
        return None
    ids, lengths = batch.input_ids.cpu(), batch.lengths.cpu()
    prompts = [ids[i, : int(p)].tolist() for i, p in enumerate(batch.prompt_lens)]
    groups = prompt_groups(prompts)
    if len(groups) == len(prompts):  # no prompt is shared: nothing to save
        return None
    device = batch.input_ids.device
    n, cols = batch.loss_mask.shape
    rows, cols_at, logps, ents = [], [], [], []
    head = fusable_head(model) if fused else None
    dtype = _compute_dtype(model)
    for group in groups:
        P = len(prompts[group[0]])
        pack = pack_group(prompts[group[0]], [ids[i, P: int(lengths[i])].tolist() for i in group])
        if pack.labels.numel() == 0:
            continue
        labels = pack.labels[None].to(device)
        kwargs = dict(input_ids=pack.input_ids.to(device), position_ids=pack.position_ids.to(device),
                      attention_mask=pack.attention_mask(form, dtype).to(device), use_cache=False,
                      logits_to_keep=pack.keep.to(device))
        if head is not None:
            with fused_head_logprobs(head, labels, temperature, with_entropy, entropy_grad, chunk):
                out = model(**kwargs).logits
            lp, ent = out[0, :, 0], (out[0, :, 1] if with_entropy else None)
            if ent is not None and not (entropy_grad and torch.is_grad_enabled()):
                ent = ent.detach()
        else:
            lp, ent = _plain_logprobs(model(**kwargs).logits, labels, temperature, with_entropy, entropy_grad)
            lp, ent = lp[0], (ent[0] if ent is not None else None)
        for i, m in zip(group, pack.lengths):
            rows.append(torch.full((m,), i, dtype=torch.long))
            cols_at.append(torch.arange(P - 1, P - 1 + m))  # column t scores token t + 1
        logps.append(lp)
        ents.append(ent)
    if not logps:
        return None
    where = (torch.cat(rows).to(device), torch.cat(cols_at).to(device))
    logp = torch.zeros((n, cols), dtype=torch.float32, device=device).index_put(where, torch.cat(logps).float())
    ent = None
    if with_entropy:
        ent = torch.zeros((n, cols), dtype=torch.float32, device=device).index_put(where, torch.cat(ents).float())
    return logp, ent


def _compute_dtype(model: nn.Module) -> torch.dtype:
    """The model's parameter dtype; a LoRA policy's reference view owns none and reads its policy's."""
    for m in (model, getattr(model, "policy", None)):
        p = next(m.parameters(), None) if m is not None else None
        if p is not None:
            return p.dtype
    return torch.float32


def _forward(model: nn.Module, batch: TokenBatch, start: int, cols: int) -> Tensor:
    """The head's output for positions ``start .. cols-1`` (position t scores token t + 1)."""
    if _accepts_logits_to_keep(model):
        keep = torch.arange(start, cols, device=batch.input_ids.device)
        return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False,
                     logits_to_keep=keep).logits
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
    return out.logits if out.logits.shape[1] == cols - start else out.logits[:, start:cols, :]


def _plain_logprobs(logits: Tensor, labels: Tensor, temperature: float, with_entropy: bool,
                    entropy_grad: bool) -> tuple[Tensor, Tensor | None]:
    """Log-probs (and entropy) from materialised ``[N, T, V]`` logits, in row chunks of bounded size.

    Rows are split with ``Tensor.split`` (one backward node for all chunks, not one full-size zero
    gradient per chunk).
    """
    rows = max(1, _CHUNK_ELEMENTS // max(1, logits[:1].numel()))
    lps, ents = [], []
    for lg, lab in zip(logits.split(rows, dim=0), labels.split(rows, dim=0)):
        lg = lg.float()
        if temperature != 1.0:
            lg = lg / temperature
        lps.append(token_logprobs(lg, lab, chunk_rows=lg.shape[0]))
        if with_entropy:
            grad = entropy_grad and torch.is_grad_enabled()
            with torch.set_grad_enabled(grad):
                # a logged statistic: one row at a time bounds its temporaries; with a gradient (an
                # entropy bonus), the whole chunk at once, keeping fewer activations for backward
                ents.append(entropy_from_logits(lg, chunk_rows=lg.shape[0] if grad else 1))
    return torch.cat(lps, dim=0), (torch.cat(ents, dim=0) if with_entropy else None)
