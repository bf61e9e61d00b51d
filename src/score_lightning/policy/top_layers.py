"""Training only the top decoder layers (``model.trainable_layers: N``), the third way to train a real model.

Why: with LoRA every backward still runs through all L layers (the adapters sit in each of them), so
a step pays the forward, its recomputation under checkpointing and a full backward. With the bottom
``L - N`` layers, the embeddings and a head tied to them frozen, autograd builds no graph below layer
``L - N``: the bottom of the forward costs what inference costs, nothing there is recomputed, and the
backward runs through N layers. The final norm trains with the top layers; an untied LM head stays
frozen too, so what trains is exactly N layers and the norm.

The KL reference is the policy's own forward with the top layers' *starting* weights, swapped in by
``torch.func.functional_call``: a copy of N / L of the weights, not a second model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from score_lightning.policy.lora import ReferenceModel

if TYPE_CHECKING:
    from score_lightning.config.schema import ModelConfig, OptimConfig


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The model's stack of decoder layers (HF ``model.model.layers`` for Llama, Qwen2, Mistral ...)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"model.trainable_layers: {type(model).__name__} has no decoder layer stack "
                         "(get_decoder().layers) to train the top of")
    return layers


def train_top_layers(model: nn.Module, n: int) -> list[str]:
    """Freeze everything except the top ``n`` decoder layers and the final norm; the trainable names."""
    layers = decoder_layers(model)
    if not 1 <= n <= len(layers):
        raise ValueError(f"model.trainable_layers={n}: the model has {len(layers)} decoder layers")
    model.requires_grad_(False)
    if hasattr(model, "disable_input_require_grads"):
        # HF's gradient_checkpointing_enable makes the embeddings' output require grad (for adapters under
        # reentrant checkpointing); here that would build, recompute and backpropagate the frozen layers
        model.disable_input_require_grads()
    for layer in layers[len(layers) - n:]:
        layer.requires_grad_(True)
    norm = getattr(model.get_decoder(), "norm", None)
    if isinstance(norm, nn.Module):
        norm.requires_grad_(True)
    return [name for name, p in model.named_parameters() if p.requires_grad]


class TopLayersReference(ReferenceModel):
    """The frozen KL reference of a top-layers policy: its forward with the trained weights at their start.

    Like LoRA's reference view (whose ``config`` and head it shares) it owns no parameters; it keeps
    copies of the trainable tensors only.
    """

    def __init__(self, policy: nn.Module):
        super().__init__(policy)
        object.__setattr__(self, "start", {n: p.detach().clone() for n, p in policy.named_parameters()
                                           if p.requires_grad})
        if not self.start:
            raise ValueError("TopLayersReference: the policy has no trainable parameters to keep the start of")

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                logits_to_keep: int | torch.Tensor | None = None, **kwargs: Any):
        if logits_to_keep is not None:
            kwargs["logits_to_keep"] = logits_to_keep
        kwargs.update(input_ids=input_ids, attention_mask=attention_mask)
        with torch.no_grad():
            return torch.func.functional_call(self.policy, self.start, args=(), kwargs=kwargs, strict=False)


def _same(a: Any, b: Any) -> bool:
    """Equal inputs of a layer call: tensors of the same shape and values, tuples of such, or both None."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and torch.equal(a, b))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a is None and b is None


_KEYS = ("attention_mask", "position_ids", "position_embeddings")


@contextlib.contextmanager
def reuse_frozen_bottom(model: nn.Module, n_top: int) -> Iterator[dict[str, int]]:
    """Within the block, the frozen bottom ``L - n_top`` layers run once per distinct input
    (``optim.reuse_frozen_bottom``).

    Why: an update runs the same rows through the model two or three times: the reference pass (the
    policy's own forward with the top layers' start swapped in), the old-policy pass when off-policy, and
    the forward with gradient. Below the top layers the weights are frozen and identical in all of them, so
    each pass recomputed the same hidden states: on SmolLM2 with 6 of 30 layers trained, 24/30 of the
    reference pass. The first call on an input records the bottom's output; a later call whose embeddings,
    mask and positions are equal (``torch.equal``) skips the bottom layers and takes the recorded output.
    Calls with a KV cache (generation) are left alone. The records (one hidden-state tensor per micro-batch and
    its input) live until the block ends. Yields counters: ``hits``, ``misses``.
    """
    layers = decoder_layers(model)
    bottom = list(layers[:len(layers) - int(n_top)])
    stats = {"hits": 0, "misses": 0}
    if not bottom:
        yield stats
        return
    records: list[tuple[torch.Tensor, dict[str, Any], torch.Tensor]] = []
    state: dict[str, Any] = {"replay": None, "record": None}
    originals = [layer.forward for layer in bottom]

    def wrap(i: int, forward):
        def call(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            if i == 0:
                state["replay"] = state["record"] = None
                if kwargs.get("past_key_values") is None and not args:
                    key = {k: kwargs.get(k) for k in _KEYS}
                    found = next((out for h, kw, out in records if _same(h, hidden_states)
                                  and all(_same(kw[k], key[k]) for k in _KEYS)), None)
                    if found is not None:
                        stats["hits"] += 1
                        state["replay"] = found
                    else:
                        stats["misses"] += 1
                        state["record"] = (hidden_states.detach(), key)
            if state["replay"] is not None:  # skip: pass through, and the last bottom layer returns the record
                out = state["replay"] if i == len(bottom) - 1 else hidden_states
                if i == len(bottom) - 1:
                    state["replay"] = None
                return out
            out = forward(hidden_states, *args, **kwargs)
            if i == len(bottom) - 1 and state["record"] is not None:
                records.append((*state["record"], out.detach()))
                state["record"] = None
            return out
        return call

    for i, layer in enumerate(bottom):
        layer.forward = wrap(i, originals[i])
    try:
        yield stats
    finally:
        for layer in bottom:
            del layer.forward  # the class's forward again


def update_scope(model_cfg: "ModelConfig", optim: "OptimConfig", model: nn.Module) -> contextlib.AbstractContextManager:
    """The block around a step's updates: :func:`reuse_frozen_bottom` when the top layers train
    (``model.trainable_layers``) and ``optim.reuse_frozen_bottom`` is on, else nothing."""
    top = model_cfg.trainable_layers
    if top is None or not optim.reuse_frozen_bottom:
        return contextlib.nullcontext({"hits": 0, "misses": 0})
    return reuse_frozen_bottom(model, int(top))
