"""Memory of a step's decoding and log-prob paths at a real vocabulary (49,152, SmolLM2's), on tiny-width models.

Tensor bytes are counted by a dispatch mode (every new storage an op creates, and when it is freed), so the
figures are exact and independent of the allocator: what the code asks for, not what glibc keeps.
"""

from __future__ import annotations

import subprocess
import sys
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

import score_lightning.rollout.hf_engine as H
from score_lightning.step.batching import build_token_batch, policy_logprobs
from score_lightning.rollout.engine import SamplingParams

VOCAB = 49152


class TensorBytes(TorchDispatchMode):
    """Bytes of storages created inside the block: ``total`` allocated, ``peak`` alive at once."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = self.total = 0
        self.sizes: dict[int, int] = {}

    def _free(self, key: int) -> None:
        self.live -= self.sizes.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and not t.is_meta:
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key and key not in self.sizes and storage.nbytes():
                    self.sizes[key] = storage.nbytes()
                    self.live += storage.nbytes()
                    self.total += storage.nbytes()
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(storage, self._free, key)
        return out


def _model(layers: int, gradient_checkpointing: bool = False) -> LlamaForCausalLM:
    """SmolLM2's shape at tiny width: 3 query heads per key-value head, tied embeddings, a 49k vocabulary."""
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=96, intermediate_size=192, num_hidden_layers=layers,
                      num_attention_heads=3, num_key_value_heads=1, head_dim=32, tie_word_embeddings=True,
                      max_position_embeddings=2048, pad_token_id=0, eos_token_id=2, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    from score_lightning.policy.attention import use_grouped_attention

    use_grouped_attention(model)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def test_decoding_allocates_half_of_what_the_concatenating_cache_did(monkeypatch):
    """HF engine decoding of 4 rows (2 prompts shared by 2 rows each), 400-token prompts, 64 new tokens:
    in-place KV, one prefill per prompt and grouped attention allocate about half of the old path's bytes
    (``torch.cat`` of every layer's cache per token, ``repeat_kv`` copies, a prefill per row), same tokens. The
    rest is per-step vocabulary work both paths do ([rows, V] logits, their log-softmax for the log-probs)."""
    model = _model(layers=12).eval()
    torch.manual_seed(1)
    a, b = torch.randint(10, VOCAB, (400,)).tolist(), torch.randint(10, VOCAB, (380,)).tolist()
    params = SamplingParams(64, 0.0, logprobs=True)

    def run():
        eng = H.HFEngine(lambda: model, 0, 2, None, 64)
        with TensorBytes() as mem:
            gens = eng.generate([a, b, a, b], params)
        return [g.token_ids for g in gens], mem

    new_ids, new = run()
    monkeypatch.setattr(H, "GrowingCache", lambda capacity: DynamicCache())
    monkeypatch.setattr(H, "prefill", lambda *args, **kw: 0)
    model.set_attn_implementation("sdpa")
    old_ids, old = run()
    assert new_ids == old_ids
    assert new.total < 0.6 * old.total, (new.total / 2**20, old.total / 2**20)  # measured: 381 vs 750 MiB


def test_update_at_a_real_vocabulary_stays_under_a_bound_the_plain_path_exceeds():
    """Forward and backward of 4 rows x 300 response tokens through a 16-layer model at V=49k: with the fused
    log-prob head and gradient checkpointing (model=smollm2_135m's setting) the peak of live tensors stays
    under the layer inputs plus a few [chunk, V] blocks; materialised logits without checkpointing exceed it."""
    rows, prompt, resp = 4, 100, 300
    torch.manual_seed(2)
    batch = build_token_batch([torch.randint(10, VOCAB, (prompt,)).tolist()] * rows,
                              [torch.randint(10, VOCAB, (resp,)).tolist() for _ in range(rows)], [[1] * resp] * rows, 0)
    tokens, layers, hidden = rows * (prompt + resp), 16, 96
    weights = sum(p.numel() * 4 for p in _model(layers).parameters())
    # gradients of the weights, the checkpointed layer inputs and ~5 float32 [chunk, V] blocks (64 MiB each)
    bound = weights + layers * tokens * hidden * 4 * 2 + 5 * (1 << 26)
    peaks = {}
    for lean in (True, False):
        model = _model(layers, gradient_checkpointing=lean).train()
        with TensorBytes() as mem:
            logp, ent = policy_logprobs(model, batch, 0.7, with_entropy=True, fused=lean)
            (logp * batch.loss_mask).sum().backward()
        peaks[lean] = mem.peak
    assert peaks[True] < bound < peaks[False], {k: v / 2**20 for k, v in peaks.items()} | {"bound": bound / 2**20}


def test_malloc_threshold_returns_freed_blocks_to_the_system():
    """With ``trainer.malloc_mmap_threshold_mb`` (cpu_memory) freed multi-MB tensors leave RSS; glibc's dynamic
    default keeps them on the heap once it has raised its threshold."""
    code = r"""
import sys, psutil, torch
from score_lightning.launch.cpu_memory import set_malloc_mmap_threshold
if sys.argv[1] == "fixed":
    assert set_malloc_mmap_threshold(4)
rss = lambda: psutil.Process().memory_info().rss / 2**20
keep = []
for rnd in range(3):  # glibc raises its threshold as blocks are freed; later rounds then stay on the heap
    big = []
    for i in range(40):
        big.append(torch.ones(2**20 * 2 + 4096 * i))  # ~8 MB each
        keep.append(torch.ones(64))                   # small blocks pinning the heap between them
    base = rss()
    del big
print(round(base - rss()))
"""
    freed = {}
    for mode in ("default", "fixed"):
        out = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, check=True)
        freed[mode] = int(out.stdout.strip().splitlines()[-1])
    assert freed["fixed"] > 250 and freed["default"] < freed["fixed"] / 2, freed


def test_gradient_checkpointing_is_active_in_training_and_after_rollouts(tiny_ckpt, tokenizer):
    """``model.gradient_checkpointing=true`` recomputes every layer: HF checkpoints only in training mode, which
    from_pretrained does not set and Lightning does not either; generation switches to eval and back."""
    from score_lightning.policy.models import load_policy

    model = load_policy(tiny_ckpt, "float32", gradient_checkpointing=True)
    calls = []
    for layer in model.model.layers:
        func = layer._gradient_checkpointing_func
        layer._gradient_checkpointing_func = lambda *a, _f=func, **k: calls.append(1) or _f(*a, **k)
    eng = H.HFEngine(lambda: model, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer, 8)
    eng.generate([[5, 6, 7, 8]], SamplingParams(3, 0.0))
    assert model.training
    batch = build_token_batch([[5, 6, 7]], [[8, 9, 10]], [[1, 1, 1]], tokenizer.pad_token_id)
    logp, _ = policy_logprobs(model, batch)
    logp.sum().backward()
    assert len(calls) == len(model.model.layers)
