"""One forward per prompt: a prompt and all its continuations packed into one row.

Why: the K rollouts of a GRPO group (and the responses of an SFT demonstration group) share their
prompt, and with real prompts that is most of every row: SmolLM2's ``smol_score`` solver rows are
~310 prompt tokens beside ~180 response tokens. Right-padded rows pay the prompt's forward (and, in
the update, its backward) K times. Here the prompt is written once, followed by each continuation;
a tree attention mask lets every continuation see the prompt and itself only, and its positions
restart at the prompt's length. Every continuation token then has exactly the context, positions and
therefore log-prob it has in its own row, and gradients flow through the prompt once (summed over
the continuations, as they are when each row recomputes it).

A key/value cache would share the prompt too, but HF drops ``past_key_values`` inside gradient-
checkpointed layers (checkpointing is on for every real model), so the packed row is what works in
training. Its mask is ``[L, L]`` for a packed length ``L``, so it suits the CPU budgets it was made
for; ``optim.share_prompt_forward`` switches it per run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

#: attention implementations that take a custom 4D mask as-is, and the mask's form for each
#: (``bool``: True attends; ``float``: additive, 0 or the dtype's minimum). Flash-attention kernels
#: read no such mask, so a model on them takes the padded path.
PACKABLE_ATTENTION = {"sdpa": "bool", "score_sdpa": "bool", "eager": "float"}


@dataclass
class PackedGroup:
    """A prompt and its continuations as one row, and where each continuation token is predicted."""

    input_ids: Tensor     # [1, L]
    position_ids: Tensor  # [1, L]
    allowed: Tensor       # [L, L] bool: query i may attend to key j
    keep: Tensor          # [M] packed positions whose hidden state predicts each continuation token
    labels: Tensor        # [M] the continuation tokens, continuation by continuation
    lengths: list[int]    # tokens of each continuation (its share of ``keep``, in order)

    def attention_mask(self, form: str, dtype: torch.dtype) -> Tensor:
        """The ``[1, 1, L, L]`` mask in the form the attention implementation reads."""
        m = self.allowed[None, None]
        if form == "bool":
            return m
        return torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill_(~m, torch.finfo(dtype).min)


def pack_group(prompt: Sequence[int], continuations: Sequence[Sequence[int]]) -> PackedGroup:
    """Pack ``prompt`` followed by every continuation; continuation ``i`` token ``j`` is predicted at
    the prompt's last position (``j = 0``) or at the packed position of its own token ``j - 1``."""
    P = len(prompt)
    if P < 1:
        raise ValueError("a packed group needs a prompt of at least one token")
    lengths = [len(c) for c in continuations]
    L = P + sum(lengths)
    ids = torch.empty(L, dtype=torch.long)
    pos = torch.empty(L, dtype=torch.long)
    allowed = torch.zeros((L, L), dtype=torch.bool)
    ids[:P] = torch.as_tensor(list(prompt), dtype=torch.long)
    pos[:P] = torch.arange(P)
    allowed[:P, :P] = torch.ones((P, P), dtype=torch.bool).tril_()
    keep, labels = [], []
    s = P
    for c, n in zip(continuations, lengths):
        if n == 0:
            continue
        ids[s:s + n] = torch.as_tensor(list(c), dtype=torch.long)
        pos[s:s + n] = torch.arange(P, P + n)
        allowed[s:s + n, :P] = True
        allowed[s:s + n, s:s + n] = torch.ones((n, n), dtype=torch.bool).tril_()
        keep.append(torch.cat([torch.tensor([P - 1]), torch.arange(s, s + n - 1)]))
        labels.append(ids[s:s + n])
        s += n
    keep_t = torch.cat(keep) if keep else torch.zeros(0, dtype=torch.long)
    labels_t = torch.cat(labels) if labels else torch.zeros(0, dtype=torch.long)
    return PackedGroup(ids[None], pos[None], allowed, keep_t, labels_t, lengths)


def mask_form(model: nn.Module) -> str | None:
    """``bool``/``float`` when the model's attention reads a custom 4D mask, else ``None``."""
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None) if config is not None else None
    return PACKABLE_ATTENTION.get(impl)


def prompt_groups(prompts: Sequence[Sequence[int]]) -> list[list[int]]:
    """Indices of rows with identical prompts, in first-seen order (a row alone is a group of one)."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(tuple(p), []).append(i)
    return list(groups.values())
