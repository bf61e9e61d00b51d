"""Grouped-query attention without copying the keys and values per query head (``score_sdpa``).

Why: with a padding mask on CPU, HF's ``sdpa`` attention repeats every key/value head for the query
heads that share it (``repeat_kv``) before calling ``scaled_dot_product_attention``: for SmolLM2
(9 query / 3 key-value heads, 30 layers) each decoding step copies the whole KV cache three times
over, per layer. Profiled on a batch of 16 rollouts, ``repeat_kv`` took 29% of the time and the copies
are a fresh allocation per layer and step. Here the query heads that share a key-value head are
folded into the query-length axis instead (``[B, Hkv, groups * q, D]``, the mask repeated along it),
which is the same attention with no copy of the keys or values.

**CPU only.** That was measured on CPU, where SDPA's math kernel takes any layout. On CUDA the
folded layout would need the mask repeated ``groups`` times (7x for Qwen2.5-7B: a real copy, not a
view, since the grouped rows cannot be a stride-0 view of the mask's rows) and would leave the fused
kernels HF's path can use, with nothing measured to gain: a query on any other device takes HF's own
``sdpa`` path, unchanged.

:func:`use_grouped_attention` switches a loaded model to it when the model runs HF ``sdpa`` with
grouped heads. ``config._attn_implementation`` is not saved with the checkpoint, so exports load with
plain ``sdpa`` elsewhere (vLLM, HF).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

NAME = "score_sdpa"


def grouped_sdpa_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                   attention_mask: torch.Tensor | None, dropout: float = 0.0,
                                   scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """HF's attention-function signature; ``query [B, H, q, D]``, ``key/value [B, Hkv, n, D]``; returns ``[B, q, H, D]``.

    Query head ``h`` reads key-value head ``h // groups`` (``repeat_kv``'s order). Without a mask and
    with ``q > 1`` (causal by flag) the grouped layout cannot use ``is_causal``: HF's own path runs then.
    """
    groups = getattr(module, "num_key_value_groups", 1)
    if (groups <= 1 or query.device.type != "cpu" or kwargs.get("position_bias") is not None or kwargs.get("cache") is not None
            or kwargs.get("output_attentions") or (attention_mask is None and query.shape[2] > 1)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs)
    b, h, q, d = query.shape
    kv_heads = key.shape[1]
    grouped = query.reshape(b, kv_heads, groups * q, d)  # row r * q + t: query head kv * groups + r, position t
    mask = attention_mask
    if mask is not None:
        mask = mask.expand(-1, -1, groups, -1) if q == 1 else mask.repeat(1, 1, groups, 1)
    out = torch.nn.functional.scaled_dot_product_attention(grouped, key, value, attn_mask=mask, dropout_p=dropout,
                                                           scale=scaling)
    return out.reshape(b, h, q, d).transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, grouped_sdpa_attention_forward)
AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


def use_grouped_attention(model: nn.Module) -> bool:
    """Switch ``model`` from ``sdpa`` to :data:`NAME` when its attention groups query heads; True when switched."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads, kv = getattr(text, "num_attention_heads", None), getattr(text, "num_key_value_heads", None)
    if not heads or not kv or heads == kv:
        return False
    model.set_attn_implementation(NAME)
    return True
