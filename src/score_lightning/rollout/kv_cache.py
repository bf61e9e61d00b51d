"""The HF engine's KV cache: written in place, and a prompt shared by several rows computed once.

Why, at a real vocabulary and depth (SmolLM2: 30 layers; Qwen2.5: 24-28):

* HF's ``DynamicLayer`` appends each decoding step with ``torch.cat``, so every generated token
  allocates and copies the whole cache of every layer. For 8 rows of 1,500 tokens that is ~550 MB
  copied per token, an O(T^2) memory traffic, and on CPU a fresh ``mmap`` of each large block: the
  hundreds of millions of minor page faults measured on SmolLM2. :class:`GrowingLayer` keeps keys
  and values in a buffer sized once for the call (prompt width + ``max_new_tokens``) and writes each
  step into it; ``keys``/``values`` are views of the filled part.
* The K rollouts of a query start from the same prompt, and ``generate`` would run the prompt's
  forward once per row. :func:`prefill` runs every distinct prompt once, copies its cache rows to
  each row that shares it, and leaves only the last prompt token for ``generate`` (which restarts
  from a filled cache).
* The agent loop calls ``generate`` once per turn with each row's whole context (prompt, response
  so far, the new observation), so every turn would run the forward over everything again: with a
  300-token prompt and three searches, most of a rollout's compute. :class:`PrefixStore` keeps the
  caches of the last calls; a row whose context extends a stored row reuses that row's keys and
  values for the common prefix, and only the new tokens (the observation) run. The store is
  dropped as soon as the weights change (an optimiser step bumps the parameters' version counters),
  and by the step at each stage boundary (``generation/generator.py``: no stage's rows extend another's).
  Calls made beside the run (the in-run evaluator probe, ``evaluation/pair_probe.py``) run under
  :func:`stores_kept`, which puts the store back as it was: their rubric prompts are the next step's, and a
  prefill that reused them would sum in another order than the run without the probe.

Numerics: cached keys and values are the same tensors a plain ``generate`` computes for each row
(a row's KV depends only on its own tokens and positions), up to the summation order of a batch of
different size.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys/values are views of a preallocated buffer (doubling if ever exceeded)."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = int(capacity)
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._n = 0

    def _rebase(self, k: torch.Tensor, v: torch.Tensor, n: int) -> None:
        self._k, self._v, self._n = k, v, n
        self.keys, self.values = k[..., :n, :], v[..., :n, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = self._n + key_states.shape[-2]
        if self._k is None or n > self._k.shape[-2]:
            cap = max(n, self.capacity if self._k is None else 2 * self._k.shape[-2])
            shape = (*key_states.shape[:-2], cap, key_states.shape[-1])
            k, v = key_states.new_empty(shape), value_states.new_empty(shape[:-1] + (value_states.shape[-1],))
            if self._k is not None:
                k[..., :self._n, :] = self._k[..., :self._n, :]
                v[..., :self._n, :] = self._v[..., :self._n, :]
            self._k, self._v = k, v
        self._k[..., self._n:n, :] = key_states
        self._v[..., self._n:n, :] = value_states
        self._rebase(self._k, self._v, n)
        return self.keys, self.values

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep (or repeat) batch rows: row ``i`` becomes old row ``index[i]``; spare capacity is kept."""
        if self._k is not None:
            self._rebase(self._k.index_select(0, index), self._v.index_select(0, index), self._n)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self._k is not None:
            self.select_rows(torch.arange(self._k.shape[0], device=self._k.device).repeat_interleave(repeats))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self._k is not None:
            self.select_rows(torch.as_tensor(indices, device=self._k.device))

    def crop(self, tokens_to_remove: int) -> None:
        if self._k is not None and tokens_to_remove < 0:
            self._rebase(self._k, self._v, max(0, self._n + tokens_to_remove))

    def reset(self) -> None:
        self._k = self._v = None
        self._n = 0
        super().reset()


class GrowingCache(DynamicCache):
    """A ``DynamicCache`` of :class:`GrowingLayer` (one per decoder layer, created on first use)."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = int(capacity)
        self.layer_class_to_replicate = lambda: GrowingLayer(capacity)

    def select_rows(self, index: torch.Tensor) -> None:
        for layer in self.layers:
            layer.select_rows(index)


@contextmanager
def stores_kept(*engines) -> Iterator[None]:
    """Run a block whose ``generate`` calls leave each engine's :class:`PrefixStore` (its entries and the weights
    they were stored for) as it was before; engines without one (scripted, vLLM) are left alone."""
    stores = {id(s): s for s in (getattr(e, "prefix_store", None) for e in engines) if isinstance(s, PrefixStore)}
    saved = [(s, list(s.entries), s._weights) for s in stores.values()]
    try:
        yield
    finally:
        for store, entries, weights in saved:
            store.entries[:] = entries
            store._weights = weights


def position_ids(attention: torch.Tensor) -> torch.Tensor:
    """Left-padded positions exactly as ``generate`` derives them (``cumsum - 1``, pads at 0)."""
    pos = attention.long().cumsum(-1) - 1
    return pos.masked_fill(attention == 0, 0)


class PrefixStore:
    """The KV caches of recent ``generate`` calls and the tokens each row holds, for reuse by later calls.

    Keeps whole calls, newest first, while they hold at most ``max_rows`` rows. Valid for one set of weights:
    :meth:`check_weights` empties it when any parameter changed in place since the entries were stored.
    """

    def __init__(self, max_rows: int, min_reuse: int = 16):
        self.max_rows, self.min_reuse = int(max_rows), int(min_reuse)
        self.entries: list[tuple[list[GrowingLayer], torch.Tensor, torch.Tensor]] = []  # layers, tokens [M, L], starts
        self._weights: tuple | None = None

    def check_weights(self, model: nn.Module) -> None:
        version = (id(model), sum(p._version for p in model.parameters()))
        if version != self._weights:
            self.entries.clear()
            self._weights = version

    def add(self, cache: GrowingCache, sequences: torch.Tensor, attention: torch.Tensor) -> None:
        """Store a finished call: ``sequences [N, W+T]`` as generated, ``attention [N, W]`` its prompts' mask.
        The cache holds every column but the last (the last sampled token was never fed)."""
        if not cache.layers or self.max_rows <= 0:
            return
        fed = cache.get_seq_length()
        starts = (attention.shape[1] - attention.sum(dim=1)).cpu()
        self.entries.insert(0, (list(cache.layers), sequences[:, :fed].cpu(), starts))
        while sum(e[1].shape[0] for e in self.entries) > self.max_rows and len(self.entries) > 1:
            self.entries.pop()

    def match(self, prompts: list[list[int]]) -> list[tuple[int, int, int]]:
        """For each prompt: (entry, row, length) of the longest stored prefix usable (all but its last token),
        or (-1, -1, 0)."""
        out = []
        for p in prompts:
            q = torch.as_tensor(p, dtype=torch.long)
            best = (-1, -1, 0)
            for e, (_, toks, starts) in enumerate(self.entries):
                for r in range(toks.shape[0]):
                    row = toks[r, int(starts[r]):]
                    n = min(len(row), len(q) - 1)
                    if n <= best[2]:
                        continue
                    neq = (row[:n] != q[:n]).nonzero()
                    lcp = int(neq[0]) if neq.numel() else n
                    if lcp > best[2]:
                        best = (e, r, lcp)
            out.append(best if best[2] >= self.min_reuse else (-1, -1, 0))
        return out


@torch.no_grad()
def prefill(model: nn.Module, input_ids: torch.Tensor, attention: torch.Tensor, cache: GrowingCache,
            store: PrefixStore | None = None) -> int:
    """Fill ``cache`` with every column but the last; returns the number of token columns x rows computed.

    When every row extends a stored row (``store``), the stored keys and values are copied and only the
    columns from the first one some row lacks are run; otherwise each distinct (ids, mask) row runs once.
    ``generate(input_ids, attention, past_key_values=cache)`` then runs only the last column. Needs at
    least two columns.
    """
    n, width = input_ids.shape
    if width < 2:
        raise ValueError("prefill needs prompts of at least two columns")
    if store is not None and store.entries:
        offsets = (width - attention.sum(dim=1)).tolist()
        prompts = [input_ids[i, int(o):].tolist() for i, o in enumerate(offsets)]
        found = store.match(prompts)
        start = min(int(o) + m[2] for o, m in zip(offsets, found))
        if start > min(offsets):
            _copy_prefixes(store, found, offsets, start, cache)
            if start < width - 1:  # else every row's context but its last token is stored: nothing to run
                model(input_ids=input_ids[:, start:width - 1], attention_mask=attention[:, :width - 1],
                      position_ids=position_ids(attention)[:, start:width - 1], past_key_values=cache, use_cache=True,
                      logits_to_keep=1)
            return n * (width - 1 - start)
    rows = torch.cat([input_ids, attention], dim=1)
    uniq, inverse = torch.unique(rows, dim=0, return_inverse=True)
    ids, mask = uniq[:, :width - 1], uniq[:, width:2 * width - 1]
    model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), past_key_values=cache, use_cache=True,
          logits_to_keep=1)
    cache.select_rows(inverse.to(input_ids.device))
    return int(uniq.shape[0]) * (width - 1)


def _copy_prefixes(store: PrefixStore, found, offsets, start: int, cache: GrowingCache) -> None:
    """Columns ``[0, start)`` of ``cache``: each row's stored prefix right-aligned at its offset, zeros on padding."""
    capacity = max(cache.capacity, start)
    for li in range(len(store.entries[0][0])):
        ref = store.entries[0][0][li]
        k = ref._k.new_zeros((len(found), ref._k.shape[1], capacity, ref._k.shape[-1]))
        v = ref._v.new_zeros((len(found), ref._v.shape[1], capacity, ref._v.shape[-1]))
        for i, ((e, r, _), off) in enumerate(zip(found, offsets)):
            m = start - int(off)  # columns this row takes from its stored prefix (none for a row that starts later)
            if m <= 0:
                continue
            src = store.entries[e][0][li]
            s0 = int(store.entries[e][2][r])
            k[i, :, int(off):start] = src._k[r, :, s0:s0 + m]
            v[i, :, int(off):start] = src._v[r, :, s0:s0 + m]
        layer = GrowingLayer(capacity)
        layer.lazy_initialization(k[:, :, :1], v[:, :, :1])
        layer._rebase(k, v, start)
        cache.layers.append(layer)
