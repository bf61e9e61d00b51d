"""Per-token log-probs and entropy straight from the final hidden states, a chunk of positions at a time.

Why: the plain path projects every response position through the LM head and keeps the
``[rows, T, V]`` logits (and their gradient) alive for backward. With a real vocabulary that is the
largest tensor of the step: 4 rows x 12,288 positions x 152k in bf16 is ~15 GB before any activation.
:class:`HeadLogprobs` instead projects ``chunk`` positions at a time, keeps only ``[positions]``
statistics (log-sum-exp, entropy) for backward, and recomputes each chunk's logits there, turning
them into the logits gradient analytically (as a fused linear-cross-entropy does). Peak extra memory
is a few ``[chunk, V]`` float32 blocks, whatever ``T``.

:func:`fused_head_logprobs` runs it *inside* the model's own forward, by standing in for the LM
head's ``forward`` during the call. The root module's forward therefore still runs (FSDP2 unshards
the root's parameters, among them ``lm_head.weight``, and registers its backward hooks on the
output), HF still slices the positions with ``logits_to_keep``, and the final norm stays the model's.
The packed per-token values come back in ``output.logits``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: float32 elements of one chunk's ``[positions, V]`` logits (16 Mi = 64 MiB): ~110 positions at
#: V = 152k, ~4,000 at the tiny model's 4k vocabulary. Backward holds about three such blocks.
CHUNK_ELEMENTS = 1 << 24

#: config fields of models that transform the head's logits after ``lm_head`` (soft-capping, scales):
#: the fused path would skip that transform, so such models take the plain path
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier",
                     "logits_scaling")


def chunk_positions(vocab: int, chunk_elements: int = CHUNK_ELEMENTS) -> int:
    """Positions per chunk so that one chunk's float32 logits hold about ``chunk_elements`` values."""
    return max(1, chunk_elements // max(1, vocab))


def _chunk_logits(h: Tensor, weight: Tensor, bias: Tensor | None, temperature: float) -> Tensor:
    """Float32 logits of one chunk, in the same op order as the plain path (linear, upcast, / T)."""
    z = F.linear(h, weight, bias).float()
    return z / temperature if temperature != 1.0 else z


class HeadLogprobs(torch.autograd.Function):
    """``log softmax(h W^T + b) / T`` at ``labels`` (and the entropy), chunked over positions.

    Inputs: ``hidden [M, H]``, ``weight [V, H]``, ``bias [V] | None``, ``labels [M]`` (negative labels
    read as token 0; mask them out). Outputs float32 ``[M]`` log-probs and the entropy (``None``
    unless ``with_entropy``; non-differentiable unless ``entropy_grad``). Backward recomputes each
    chunk's logits and uses ``d logp/dz = onehot - p`` and ``dH/dz = -p (log p + H)``, divided by T.
    """

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor, temperature: float,
                chunk: int, with_entropy: bool, entropy_grad: bool,
                hits: list | None = None) -> tuple[Tensor, Tensor | None]:
        ctx.set_materialize_grads(False)
        labels = labels.clamp(min=0)
        m = hidden.shape[0]
        logp = hidden.new_empty(m, dtype=torch.float32)
        lse = hidden.new_empty(m, dtype=torch.float32)
        ent = hidden.new_empty(m, dtype=torch.float32) if with_entropy else None
        for s in range(0, m, chunk):
            e = min(s + chunk, m)
            z = _chunk_logits(hidden[s:e], weight, bias, temperature)
            if hits is not None:  # whether each label is the argmax (SFT's token accuracy), from the same logits
                hits.append(z.argmax(dim=-1) == labels[s:e])
            if ent is None:
                lse[s:e] = torch.logsumexp(z, dim=-1)
                logp[s:e] = z.gather(-1, labels[s:e, None]).squeeze(-1) - lse[s:e]
                continue
            # shift by the max (in place): the entropy's two terms are then O(log V), no cancellation
            mx = z.amax(dim=-1, keepdim=True)
            zs = z.sub_(mx)
            ex = zs.exp()  # one exp serves both the normaliser and the entropy
            total = ex.sum(dim=-1)
            lse_s = total.log()
            lse[s:e] = lse_s + mx.squeeze(-1)
            logp[s:e] = zs.gather(-1, labels[s:e, None]).squeeze(-1) - lse_s
            ent[s:e] = lse_s - torch.bmm(ex.unsqueeze(1), zs.unsqueeze(-1)).view(-1) / total
            del z, zs, ex
        ctx.save_for_backward(hidden, weight, bias, labels, lse, ent if entropy_grad else None)
        ctx.temperature, ctx.chunk = temperature, chunk
        if ent is not None and not entropy_grad:
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp: Tensor | None, g_ent: Tensor | None):  # type: ignore[override]
        hidden, weight, bias, labels, lse, ent = ctx.saved_tensors
        if ent is None:
            g_ent = None
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.zeros_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
        m, t = hidden.shape[0], ctx.temperature
        for s in range(0, m, ctx.chunk):
            e = min(s + ctx.chunk, m)
            logp_all = _chunk_logits(hidden[s:e], weight, bias, t).sub_(lse[s:e, None])  # log p, [c, V]
            p = logp_all.exp()
            if g_logp is not None:
                gl = g_logp[s:e, None].float()
                g = p.mul(gl.neg()).scatter_add_(-1, labels[s:e, None], gl)
            else:
                g = torch.zeros_like(p)
            if g_ent is not None:
                g.sub_(logp_all.add_(ent[s:e, None]).mul_(p).mul_(g_ent[s:e, None].float()))
            del p, logp_all
            if t != 1.0:
                g.div_(t)
            g = g.to(weight.dtype)
            h = hidden[s:e].to(weight.dtype)
            if grad_h is not None:
                grad_h[s:e] = (g @ weight).to(grad_h.dtype)
            if grad_w is not None and g.dtype == grad_w.dtype:
                grad_w.addmm_(g.t(), h)  # in place: no [V, H] temporary per chunk
            elif grad_w is not None:
                grad_w.add_((g.t() @ h).float())
            if grad_b is not None:
                grad_b.add_(g.sum(dim=0).float())
        return (grad_h, grad_w.to(weight.dtype) if grad_w is not None else None,
                grad_b.to(bias.dtype) if grad_b is not None else None, None, None, None, None, None, None)


def head_logprobs(hidden: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor, temperature: float = 1.0,
                  with_entropy: bool = False, entropy_grad: bool = False,
                  chunk: int | None = None) -> tuple[Tensor, Tensor | None]:
    """:class:`HeadLogprobs` on ``hidden [..., H]`` and ``labels [...]``; outputs shaped like ``labels``."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if hidden.shape[:-1] != labels.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} does not align with labels {tuple(labels.shape)}")
    chunk = chunk or chunk_positions(weight.shape[0])
    flat_h = hidden.reshape(-1, hidden.shape[-1])
    logp, ent = HeadLogprobs.apply(flat_h, weight, bias, labels.reshape(-1), float(temperature), int(chunk),
                                   bool(with_entropy), bool(entropy_grad))
    return logp.view(labels.shape), (ent.view(labels.shape) if ent is not None else None)


def head_cross_entropy(hidden: Tensor, head: nn.Linear, targets: Tensor) -> tuple[Tensor, Tensor]:
    """Per-position cross-entropy of ``targets`` under ``head(hidden)`` and whether each is the argmax (float),
    without the ``[positions, V]`` logits: SFT's loss at a real vocabulary in position chunks (:class:`HeadLogprobs`).
    ``hidden [M, H]``, ``targets [M]``."""
    hits: list[Tensor] = []
    flat = hidden.reshape(-1, hidden.shape[-1])
    logp, _ = HeadLogprobs.apply(flat, head.weight, head.bias, targets.reshape(-1), 1.0,
                                 chunk_positions(head.weight.shape[0]), False, False, hits)
    correct = torch.cat(hits) if hits else targets.new_zeros(0, dtype=torch.bool)
    return -logp, correct.float()


def fusable_head(model: nn.Module) -> nn.Linear | None:
    """The model's LM head when the fused path reproduces its logits exactly, else ``None``.

    A plain ``nn.Linear`` (FSDP2's wrapper classes subclass it and keep its forward) on a model that
    applies no transform after the head. LoRA-wrapped or quantised heads take the plain path.
    """
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if not isinstance(head, nn.Linear) or type(head).forward is not nn.Linear.forward:
        return None
    cfg = getattr(model, "config", None)
    if cfg is not None and hasattr(cfg, "get_text_config"):
        cfg = cfg.get_text_config()
    if any(getattr(cfg, name, None) not in (None, 1.0) for name in _LOGIT_TRANSFORMS):
        return None
    return head


@contextlib.contextmanager
def fused_head_logprobs(head: nn.Linear, labels: Tensor, temperature: float, with_entropy: bool,
                        entropy_grad: bool, chunk: int | None = None) -> Iterator[None]:
    """Within the block, ``head(hidden)`` returns ``[N, T, 1 or 2]`` packed (log-prob, entropy) of ``labels``.

    ``hidden`` is what the model passes its head: ``[N, T, H]`` aligned with ``labels [N, T]``, or
    all ``L`` positions (a model without ``logits_to_keep``), of which the last ``T`` before the
    final position are kept. The weight is read inside the head's own call, where FSDP2 has already
    unsharded it; a DTensor weight (tensor parallelism) is gathered with the differentiable
    ``full_tensor``.
    """

    def forward(hidden: Tensor) -> Tensor:
        if hidden.shape[1] != labels.shape[1]:
            end = hidden.shape[1] - 1
            hidden = hidden[:, end - labels.shape[1]:end]
        weight, bias = head.weight, head.bias
        if hasattr(weight, "full_tensor"):
            weight = weight.full_tensor()
            bias = bias.full_tensor() if bias is not None else None
        logp, ent = head_logprobs(hidden, weight, bias, labels, temperature, with_entropy, entropy_grad, chunk)
        return torch.stack([logp, ent], dim=-1) if ent is not None else logp.unsqueeze(-1)

    head.forward = forward  # an instance attribute: nn.Module.__call__ (and FSDP's hooks) still run
    try:
        yield
    finally:
        del head.forward
