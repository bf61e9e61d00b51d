"""The fused, position-chunked log-prob head equals the plain path (values and gradients, float32, 1e-5).

Plain path: ``[N, T, V]`` logits, then ``losses.token_logprobs`` / ``entropy_from_logits``. Fused path:
``logprobs.HeadLogprobs`` from the final hidden states, chunk by chunk, recomputed in backward.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from score_lightning.step.batching import build_token_batch, policy_logprobs
from score_lightning.policy.logprobs import fusable_head, head_logprobs
from score_lightning.step.losses import entropy_from_logits, token_logprobs
from score_lightning.policy.models import load_policy

TOL = 1e-5


def _close(a, b):
    """Max abs difference <= 1e-5 x the tensor's scale (max(1, max |b|)).

    Both paths round differently in float32 (matmul blocking, chunked sums); measured against a
    float64 reference, their errors are of the same order, about 1e-6 of the largest gradient.
    """
    assert a.shape == b.shape, (a.shape, b.shape)
    diff, scale = float((a - b).abs().max()), max(1.0, float(b.abs().max()))
    assert diff <= TOL * scale, f"max |diff| {diff:.3g} > {TOL} x {scale:.3g}"


def _plain(hidden, weight, bias, labels, temperature, entropy_grad):
    logits = F.linear(hidden, weight, bias).float() / temperature
    logp = token_logprobs(logits, labels)
    with torch.set_grad_enabled(entropy_grad):
        ent = entropy_from_logits(logits)
    return logp, ent


def _random_head(seed: int, scale: float = 1.0, bias: bool = True):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(3, 11, 16, generator=g) * scale).requires_grad_()
    weight = torch.randn(97, 16, generator=g).requires_grad_()
    b = torch.randn(97, generator=g).requires_grad_() if bias else None
    labels = torch.randint(0, 97, (3, 11), generator=g)
    labels[0, :2] = -100  # an ignore index reads as token 0, as in token_logprobs
    return hidden, weight, b, labels


def _grads(fn, tensors, seed: int):
    """Values and the gradients of a random weighted sum of log-probs (and entropy, when it has a grad)."""
    for t in tensors:
        t.grad = None
    logp, ent = fn()
    g = torch.Generator().manual_seed(seed)
    loss = (logp * torch.randn(logp.shape, generator=g)).sum()
    if ent is not None and ent.requires_grad:
        loss = loss + (ent * torch.randn(ent.shape, generator=g)).sum()
    loss.backward()
    return logp.detach(), (ent.detach() if ent is not None else None), tuple(t.grad.clone() for t in tensors)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy_grad", [False, True])
@pytest.mark.parametrize("scale", [1.0, 6.0])  # logits up to ~100: the max shift keeps the entropy exact
def test_head_logprobs_equal_plain_values_and_gradients(temperature, entropy_grad, scale):
    hidden, weight, bias, labels = _random_head(0, scale)
    ins = [hidden, weight, bias]
    ref = _grads(lambda: _plain(hidden, weight, bias, labels, temperature, entropy_grad), ins, 1)
    for chunk in (1, 4, 33, 1000):  # one position per chunk, uneven chunks, a single chunk
        got = _grads(lambda: head_logprobs(hidden, weight, bias, labels, temperature, with_entropy=True,
                                           entropy_grad=entropy_grad, chunk=chunk), ins, 1)
        for a, b in zip(got[:2] + tuple(got[2]), ref[:2] + tuple(ref[2])):
            _close(a, b)


def test_entropy_without_grad_is_detached_and_logprob_only_path():
    hidden, weight, _, labels = _random_head(2, bias=False)
    logp, ent = head_logprobs(hidden, weight, None, labels, with_entropy=True, chunk=5)
    assert logp.requires_grad and not ent.requires_grad
    only, none = head_logprobs(hidden, weight, None, labels, chunk=5)
    assert none is None
    torch.testing.assert_close(only, logp)
    with torch.no_grad():
        nograd, _ = head_logprobs(hidden, weight, None, labels, chunk=5)
    assert not nograd.requires_grad
    with pytest.raises(ValueError):
        head_logprobs(hidden, weight, None, labels, temperature=0.0)


def _tiny_batch(tokenizer):
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in ("Why is the sky blue?", "Hi")]
    responses = [list(range(40, 57)), list(range(60, 70))]
    masks = [[1] * 5 + [0] * 4 + [1] * 8, [1] * 10]  # row 0 has an observation span
    return build_token_batch(prompts, responses, masks, pad_id=tokenizer.pad_token_id)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("with_entropy,entropy_grad", [(False, False), (True, False), (True, True)])
def test_policy_logprobs_fused_equals_plain_on_the_tiny_model(tiny_ckpt, tokenizer, temperature, with_entropy,
                                                               entropy_grad):
    torch.manual_seed(0)
    model = load_policy(tiny_ckpt)
    assert fusable_head(model) is model.lm_head
    batch = _tiny_batch(tokenizer)
    params = [p for p in model.parameters() if p.requires_grad]

    def run(fused):
        return _grads(lambda: policy_logprobs(model, batch, temperature, with_entropy, entropy_grad, fused=fused,
                                              chunk=7), params, 3)

    plain, fused = run(False), run(True)
    _close(fused[0], plain[0])
    if with_entropy:
        _close(fused[1], plain[1])
    else:
        assert fused[1] is None
    for a, b in zip(fused[2], plain[2]):
        _close(a, b)
    # the head's forward is restored: generation and plain calls see logits again
    assert model(input_ids=batch.input_ids[:, :4]).logits.shape[-1] == model.config.vocab_size


def _small_qwen(tie: bool, vocab: int = 512):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=tie)
    return Qwen2ForCausalLM(cfg).float()


def test_tied_head_gradients_equal_plain():
    model = _small_qwen(tie=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    batch = build_token_batch([[1, 2, 3, 4]], [list(range(5, 25))], [[1] * 20], pad_id=0)
    params = [p for p in model.parameters() if p.requires_grad]
    plain, fused = (_grads(lambda: policy_logprobs(model, batch, 0.8, True, True, fused=f, chunk=6), params, 4)
                    for f in (False, True))
    for a, b in zip(fused[0:2] + tuple(fused[2]), plain[0:2] + tuple(plain[2])):
        _close(a, b)


def test_heads_that_transform_logits_take_the_plain_path():
    model = _small_qwen(tie=False)
    model.config.final_logit_softcapping = 30.0
    assert fusable_head(model) is None
    model.config.final_logit_softcapping = None
    assert fusable_head(model) is model.lm_head


class _LargestTensor(TorchDispatchMode):
    """Records the largest tensor any op produces (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_fused_path_never_materialises_rows_x_positions_x_vocab():
    vocab, rows, length = 2048, 2, 96
    model = _small_qwen(tie=False, vocab=vocab)
    batch = build_token_batch([[1, 2]] * rows, [list(range(3, 3 + length))] * rows, [[1] * length] * rows, pad_id=0)
    full = rows * length * vocab
    sizes = {}
    for fused in (False, True):
        with _LargestTensor() as mode:
            logp, ent = policy_logprobs(model, batch, with_entropy=True, entropy_grad=True, fused=fused, chunk=16)
            (logp.sum() + ent.sum()).backward()
        sizes[fused] = mode.largest
    assert sizes[False] >= full  # the plain path holds the whole [rows, T, V] block
    assert sizes[True] <= max(16 * vocab, vocab * 64), sizes  # one chunk's logits, or the [V, H] weight gradient


def test_head_cross_entropy_equals_plain_values_gradients_and_accuracy():
    """SFT's chunked loss (logprobs.head_cross_entropy) against F.cross_entropy on materialised logits."""
    from score_lightning.policy.logprobs import head_cross_entropy

    torch.manual_seed(3)
    head = torch.nn.Linear(16, 300, bias=False)
    hidden = torch.randn(50, 16, requires_grad=True)
    targets = torch.randint(0, 300, (50,))
    targets[:5] = (hidden[:5] @ head.weight.t()).argmax(-1)  # some positions where the target is the argmax
    ce, ok = head_cross_entropy(hidden, head, targets)
    logits = head(hidden).float()
    ref = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
    assert torch.allclose(ce, ref, atol=1e-5)
    assert torch.equal(ok, (logits.argmax(-1) == targets).float()) and ok[:5].sum() == 5
    g1 = torch.autograd.grad(ce.sum(), (hidden, head.weight))
    g2 = torch.autograd.grad(ref.sum(), (hidden, head.weight))
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(g1, g2))
