"""The supervised cold-start ``LightningModule``: masked next-token cross-entropy on demonstrations.

Only response tokens the model itself would write are trained (mask 1); prompts, observations and
padding are not. The loss is a token mean over the whole optimiser step.

Demonstrations come in *groups* that share one prompt (several rubrics for one rubric prompt, K
trajectories for one solver prompt, as RL samples them). With ``shared_prompt`` (the default) the
prompt is encoded once per group, packed with the group's responses into one row;
losses and gradients are exactly those of encoding every ``prompt + response`` separately (a test
checks this), at a fraction of the cost, since prompts are most of every sequence. Logits are
formed only at trained positions.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from torch import Tensor, nn
from torch.utils.data import DataLoader, Sampler

from score_lightning.step.batching import TokenBatch, build_token_batch
from score_lightning.policy.logprobs import fusable_head, head_cross_entropy
from score_lightning.sft.demo_types import Demo
from score_lightning.policy.shared_prefix import mask_form, pack_group


# ---------------------------------------------------------------------------- data
@dataclass
class DemoGroup:
    """Responses sharing one prompt."""

    kind: str
    prompt_ids: list[int]
    responses: list[list[int]]
    masks: list[list[int]]

    @property
    def num_trained(self) -> int:
        return sum(sum(m) for m in self.masks)


def group_demos(demos: Sequence[Demo]) -> list[DemoGroup]:
    """Group demos by ``Demo.group`` (demos without a group, or whose prompt differs, stand alone)."""
    groups: dict[object, DemoGroup] = {}
    for i, d in enumerate(demos):
        key = (d.group, tuple(d.prompt_ids)) if d.group >= 0 else ("single", i)
        g = groups.get(key)
        if g is None:
            groups[key] = DemoGroup(d.kind, list(d.prompt_ids), [list(d.response_ids)], [list(d.response_mask)])
        else:
            g.responses.append(list(d.response_ids))
            g.masks.append(list(d.response_mask))
    return list(groups.values())


class GroupBatchSampler(Sampler[list[int]]):
    """Shuffled batches of ``batch_size`` groups, reshuffled every epoch, seeded."""

    def __init__(self, n: int, batch_size: int, seed: int = 0):
        self.n, self.batch_size, self.seed, self.epoch = n, max(1, int(batch_size)), int(seed), 0

    def __len__(self) -> int:
        return math.ceil(self.n / self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        rng = random.Random(f"{self.seed}-{self.epoch}")
        self.epoch += 1
        idx = list(range(self.n))
        rng.shuffle(idx)
        return iter([idx[s : s + self.batch_size] for s in range(0, self.n, self.batch_size)])


def _collate(groups: list[DemoGroup]) -> list[DemoGroup]:
    return list(groups)


def make_loader(demos: Sequence[Demo], batch_size: int, seed: int = 0) -> DataLoader:
    """Batches of ``batch_size`` prompt groups (each group: one prompt, its responses)."""
    groups = group_demos(demos)
    return DataLoader(groups, batch_sampler=GroupBatchSampler(len(groups), batch_size, seed),
                      collate_fn=_collate, num_workers=0)


def collate_demos(demos: Sequence[Demo], pad_id: int) -> TokenBatch:
    """Plain right-padded ``prompt + response`` rows (the reference path)."""
    return build_token_batch([d.prompt_ids for d in demos], [d.response_ids for d in demos],
                             [d.response_mask for d in demos], pad_id)


# ---------------------------------------------------------------------------- losses
def token_losses(model: nn.Module, batch: TokenBatch) -> tuple[Tensor, Tensor]:
    """Cross-entropy and correctness at every position where ``batch.loss_mask`` is 1 (reference path)."""
    sel = batch.loss_mask > 0
    decoder, head = _parts(model)
    if decoder is not None and head is not None:
        hidden = decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).last_hidden_state
        return _head_losses(model, head, hidden[:, :-1][sel], batch.input_ids[:, 1:][sel])
    else:
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
        logits = out.logits[:, :-1][sel].float()
    targets = batch.input_ids[:, 1:][sel]
    return F.cross_entropy(logits, targets, reduction="none"), (logits.detach().argmax(-1) == targets).float()


def masked_lm_loss(model: nn.Module, batch: TokenBatch) -> tuple[Tensor, Tensor, int]:
    """Token-mean cross-entropy and accuracy over the positions where ``batch.loss_mask`` is 1."""
    n = int((batch.loss_mask > 0).sum())
    if n == 0:
        zero = next(model.parameters()).sum() * 0.0
        return zero, zero.detach(), 0
    ce, correct = token_losses(model, batch)
    return ce.mean(), correct.mean(), n


def _head_losses(model: nn.Module, head: nn.Module, hidden: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """Cross-entropy and correctness of ``targets``; in position chunks when the head allows (a real vocabulary's
    ``[tokens, V]`` float32 logits and their gradient are the largest tensors of an SFT step otherwise)."""
    if fusable_head(model) is head:
        return head_cross_entropy(hidden, head, targets)
    logits = head(hidden).float()
    return F.cross_entropy(logits, targets, reduction="none"), (logits.detach().argmax(-1) == targets).float()


def _parts(model: nn.Module):
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return decoder, head


def group_token_losses(model: nn.Module, group: DemoGroup, pad_id: int, shared_prompt: bool = True,
                       with_prompt: bool = False) -> tuple[Tensor, Tensor, Tensor | None]:
    """Per-token cross-entropy and correctness for one group's trained tokens (+ prompt LM losses).

    Shared path: the prompt and all R responses as one packed row (:mod:`score_lightning.policy.shared_prefix`:
    each response sees the prompt and itself, at its own positions), one forward; a response token is
    predicted at the prompt's last position or its predecessor's. Reference path: R separate padded rows.
    (A repeated key/value cache of the prompt, the earlier shared path, is dropped by HF inside
    gradient-checkpointed layers: the responses were then trained without their prompt.)
    With ``with_prompt`` the third value is the cross-entropy of predicting ``prompt[1:]`` (once per
    group), else ``None``.
    """
    device = next(model.parameters()).device
    decoder, head = _parts(model)
    P = len(group.prompt_ids)
    form = mask_form(model)
    if not shared_prompt or decoder is None or head is None or P < 2 or form is None:
        demos = [Demo(group.kind, group.prompt_ids, r, m) for r, m in zip(group.responses, group.masks)]
        ce, ok = token_losses(model, collate_demos(demos, pad_id).to(device))
        prompt_ce = None
        if with_prompt and P >= 2:
            ids = torch.tensor([group.prompt_ids], device=device)
            out = model(input_ids=ids, use_cache=False)
            prompt_ce = F.cross_entropy(out.logits[0, :-1].float(), ids[0, 1:], reduction="none")
        return ce, ok, prompt_ce
    for r, m in zip(group.responses, group.masks):
        if len(r) != len(m):
            raise ValueError(f"response has {len(r)} ids but mask has {len(m)}")
    pack = pack_group(group.prompt_ids, group.responses)
    hidden = decoder(input_ids=pack.input_ids.to(device), position_ids=pack.position_ids.to(device),
                     attention_mask=pack.attention_mask(form, next(model.parameters()).dtype).to(device),
                     use_cache=False).last_hidden_state[0]
    prompt_ce = None
    if with_prompt:
        targets = torch.tensor(group.prompt_ids[1:], device=device)
        prompt_ce = _head_losses(model, head, hidden[: P - 1], targets)[0]
    sel = torch.as_tensor([bool(x) for m in group.masks for x in m], dtype=torch.bool)
    keep = pack.keep[sel].to(device)
    ce, correct = _head_losses(model, head, hidden[keep], pack.labels[sel].to(device))
    return ce, correct, prompt_ce


# ---------------------------------------------------------------------------- module
class SFTModule(LightningModule):
    """AdamW with linear warmup and cosine decay to ``min_lr_ratio``.

    Logs ``sft/loss`` and ``sft/token_acc`` (token means over the step's response tokens), per-kind
    ``sft/loss_<kind>``, ``sft/prompt_loss`` (when ``prompt_loss_weight > 0``), ``sft/lr`` and
    ``sft/trained_tokens``.

    ``prompt_loss_weight`` adds that weight times the next-token loss on the *prompt* tokens (never
    on observations). A model trained from scratch learns the language of prompts and reports from
    it (including every dimension name of the pool), which it otherwise never sees as targets.
    """

    def __init__(self, model: nn.Module, pad_id: int, lr: float = 3e-3, weight_decay: float = 0.0, betas=(0.9, 0.98),
                 warmup_steps: int = 20, max_steps: int = 1000, min_lr_ratio: float = 0.1, grad_clip: float = 1.0,
                 shared_prompt: bool = True, prompt_loss_weight: float = 0.0):
        super().__init__()
        self.model = model
        self.pad_id = int(pad_id)
        self.lr = float(lr)
        self.weight_decay = float(weight_decay)
        self.betas = tuple(float(b) for b in betas)
        self.warmup_steps = int(warmup_steps)
        self.max_steps = max(1, int(max_steps))
        self.min_lr_ratio = float(min_lr_ratio)
        self.grad_clip = float(grad_clip)
        self.shared_prompt = bool(shared_prompt)
        self.prompt_loss_weight = float(prompt_loss_weight)
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

    def step_loss(self, groups: list[DemoGroup]) -> tuple[Tensor, dict[str, float], int]:
        """Token-mean response loss over every group of the step (+ weighted prompt LM loss), and stats.

        The returned loss is what is optimised; ``sft/loss`` in the stats is the response-only part.
        """
        total = sum(g.num_trained for g in groups)
        if total == 0:
            return next(self.model.parameters()).sum() * 0.0, {}, 0
        with_prompt = self.prompt_loss_weight > 0
        resp_loss = None
        prompt_parts: list[Tensor] = []
        correct = 0.0
        per_kind: dict[str, list[float]] = {}
        for g in groups:
            if g.num_trained == 0:
                continue
            ce, ok, pce = group_token_losses(self.model, g, self.pad_id, self.shared_prompt, with_prompt)
            part = ce.sum() / total
            resp_loss = part if resp_loss is None else resp_loss + part
            if pce is not None and pce.numel():
                prompt_parts.append(pce)
            correct += float(ok.sum())
            acc = per_kind.setdefault(g.kind, [0.0, 0.0])
            acc[0] += float(ce.detach().sum())
            acc[1] += float(ce.numel())
        stats = {"sft/loss": float(resp_loss.detach()), "sft/token_acc": correct / total}
        stats.update({f"sft/loss_{k}": v[0] / max(v[1], 1.0) for k, v in per_kind.items()})
        loss = resp_loss
        if prompt_parts:
            prompt_loss = torch.cat(prompt_parts).mean()
            stats["sft/prompt_loss"] = float(prompt_loss.detach())
            loss = loss + self.prompt_loss_weight * prompt_loss
        return loss, stats, total

    def training_step(self, batch: list[DemoGroup], batch_idx: int) -> Tensor:
        loss, stats, n = self.step_loss(batch)
        self.tokens_seen += n
        bs = max(1, len(batch))
        for k, v in stats.items():
            self.log(k, v, on_step=True, prog_bar=k in ("sft/loss", "sft/token_acc"), batch_size=bs)
        self.log("sft/lr", self.lr * self.lr_factor(self.global_step), on_step=True, batch_size=bs)
        self.log("sft/trained_tokens", float(self.tokens_seen), on_step=True, batch_size=bs)
        return loss

    def transfer_batch_to_device(self, batch, device, dataloader_idx: int):
        return batch  # groups are tensorised on the model's device in group_token_losses
