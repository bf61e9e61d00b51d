"""Grammar-constrained decoding that feeds the grammar's forced tokens in one forward (jump-forward).

Why: in a constrained scoring turn most tokens are the only ones the grammar allows: ``<score
dim="accuracy" value="``, the closing tags, the next ``<report id="2">``. On SmolLM2 after its cold
start, 60% of the decoding steps of a scoring turn had exactly one allowed token. Masking token by token
(:class:`~score_lightning.rollout.constrained.GrammarLogitsProcessor` inside ``generate``) spends a full
decoding step on each; on a CPU, where a step reads every weight, that is ~100 ms per forced token.
Here, after each sampled token, llguidance's ``compute_ff_tokens`` gives the run of forced tokens that
follows, and the run enters the model together with that token in one forward, whose last position
gives the logits of the next free token. A turn takes one forward per free token instead of one per token.

The distribution is that of masking: a forced token has probability 1 under the mask, whatever the
temperature and top-p. One difference: where several tokenisations spell the forced text, llguidance
forces its canonical one, where masking lets the model choose among them (vLLM's and SGLang's
jump-forward do the same). Scoring tokens are never trained. Log-probs are those of the unconstrained
``softmax(logits / T)`` at every generated token, forced ones included, as the engine's recorder gives.

Layout: rows advance by different numbers of tokens per forward. Each forward right-pads every row's
new tokens to the longest run, with the padding masked out (holes in the attention mask; each row's
positions count only its real tokens). Afterwards :func:`compact` gathers each row's real columns of the
KV cache, left-padded, so the engine's :class:`~score_lightning.rollout.kv_cache.PrefixStore` can
reuse them for the row's next turn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers import TopPLogitsWarper

from score_lightning.rollout.constrained import allowed_tokens, grammar_matchers, mask_disallowed
from score_lightning.rollout.kv_cache import GrowingCache, GrowingLayer
from score_lightning.rollout.stops import completes_stop, stop_window
from score_lightning.rollout.value_readout import ValueReadout, read_values


@dataclass
class _Row:
    """One row's decoding state: what it generated, what it feeds next, whether it is finished."""

    matcher: Any  # llguidance.LLMatcher, or None for a free row
    feed: list[int]  # tokens the next forward takes (the last sampled one and the forced run after it)
    position: int  # the position of feed[0]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    done: bool = False  # nothing more to sample
    closing: bool = False  # finished inside a forced run: feeding the rest of it gives the run's log-probs
    last: int = 0  # the column of the row's last fed token in the latest forward
    readouts: list[tuple[int, float]] = field(default_factory=list)  # (index in tokens, E[value]) per score value


@dataclass
class Decoded:
    """What :func:`grammar_decode` returns: the generated ids (and log-probs) of each row, and how many forwards."""

    tokens: list[list[int]]
    logprobs: list[list[float]] | None
    forwards: int
    cache_tokens: torch.Tensor  # [N, F] the ids whose keys and values the compacted cache holds, left-padded
    cache_mask: torch.Tensor  # [N, F] 1 on those columns
    readouts: list[list[tuple[int, float]]] | None = None  # per row: (token index, expected value) of each score value


@torch.no_grad()
def grammar_decode(model: nn.Module, input_ids: torch.Tensor, attention: torch.Tensor, cache: GrowingCache,
                   grammars: Sequence[str | None], tokenizer, *, max_new_tokens: int, temperature: float, top_p: float,
                   stop_ids: Sequence[int], stop_strings: Sequence[str], eos_ids: Sequence[int], pad_id: int,
                   want_logprobs: bool, max_forward_tokens: int = 16, readout: ValueReadout | None = None) -> Decoded:
    """Decode left-padded ``input_ids [N, W]`` whose ``cache`` holds every column but the last (``kv_cache.prefill``).

    ``grammars``: one Lark grammar per row (``None``: free). A row stops on a token in ``stop_ids`` (kept),
    on the token completing a stop string, or after ``max_new_tokens``; the caller cuts the turn
    (``stops.first_stop``) as after ``generate``. On return ``cache`` is compacted (see the module docstring).
    ``max_forward_tokens``: the most token columns x live rows one forward takes
    (``rollout.grammar_fast_forward_tokens``). ``readout``: also read each score value's expected value from the
    model's distribution at its first token (``evaluator.score_readout=expected``, :mod:`~.value_readout`); an
    ambiguous first token (``1`` of 1 or 10) costs one extra forward, whose column no later token attends to.
    """
    n, width = input_ids.shape
    device = input_ids.device
    vocab = int(model.get_output_embeddings().weight.shape[0])
    rows = [_Row(m, [int(input_ids[i, -1])], int(attention[i].sum()) - 1)
            for i, m in enumerate(grammar_matchers(grammars, tokenizer, vocab, eos_ids))]
    stops, strings = set(int(t) for t in stop_ids), tuple(stop_strings)
    window = stop_window(strings)
    sample = temperature > 0
    top_p_warp = TopPLogitsWarper(top_p) if sample and top_p < 1.0 else None
    fed_ids, fed_mask = [input_ids[:, :width - 1]], [attention[:, :width - 1].long()]
    forwards = 0

    def branch(tokens: dict[int, int]) -> dict[int, torch.Tensor]:
        """Raw logits after feeding ``tokens[row]`` at each row's next position, in a column masked out afterwards."""
        nonlocal forwards
        ids = torch.full((n, 1), pad_id, dtype=torch.long)
        mask = torch.zeros((n, 1), dtype=torch.long)
        pos = torch.zeros((n, 1), dtype=torch.long)
        for i, t in tokens.items():
            ids[i, 0], mask[i, 0], pos[i, 0] = t, 1, rows[i].position
        out = model(input_ids=ids.to(device), attention_mask=torch.cat(fed_mask + [mask], dim=1).to(device),
                    position_ids=pos.to(device), past_key_values=cache, use_cache=True).logits.float()
        forwards += 1
        fed_ids.append(ids)
        fed_mask.append(torch.zeros_like(mask))  # the branch never happened for every later token (and compact)
        return {i: out[i, 0] for i in tokens}

    def add(row: _Row, token: int) -> bool:
        """Append a generated token; True when it ends the row."""
        row.tokens.append(token)
        return token in stops or completes_stop(tokenizer.decode, row.tokens, strings, window) \
            or len(row.tokens) >= max_new_tokens

    while any(not r.done for r in rows):
        live = [i for i, r in enumerate(rows) if not r.done]
        # the forward's width: the longest feed, but at most max_forward_tokens over all live rows (a row's feed
        # beyond it waits for the next forward): n rows padded to one long run would cost n x run tokens
        m = min(max(len(rows[i].feed) for i in live), max(1, max_forward_tokens // len(live)))
        ids = torch.full((n, m), pad_id, dtype=torch.long)
        mask = torch.zeros((n, m), dtype=torch.long)
        pos = torch.zeros((n, m), dtype=torch.long)
        for i in live:
            r = rows[i]
            k = min(len(r.feed), m)
            ids[i, :k] = torch.tensor(r.feed[:k])
            mask[i, :k] = 1
            pos[i] = torch.arange(r.position, r.position + m)
        fed_ids.append(ids)
        fed_mask.append(mask)
        full_mask = torch.cat(fed_mask, dim=1).to(device)
        logits = model(input_ids=ids.to(device), attention_mask=full_mask, position_ids=pos.to(device),
                       past_key_values=cache, use_cache=True).logits.float()
        forwards += 1
        model_logits = logits if readout is not None else None  # the readout reads the model's own T = 1 distribution
        if sample and temperature != 1.0:
            logits = logits / temperature
        nxt = []  # rows that sample a token from this forward's last real position
        for i in live:
            r = rows[i]
            k = min(len(r.feed), m)
            fed, r.feed = r.feed[:k], r.feed[k:]
            # log-probs of forced tokens under the logits before each: fed[0]'s is already recorded (sampled, or
            # the first of a run the previous forward cut), fed[1:] from this forward, and the next queued one too
            targets = fed[1:] + r.feed[:1]
            if want_logprobs and targets:
                lp = torch.log_softmax(logits[i, :len(targets)], dim=-1)
                r.logprobs += lp.gather(-1, torch.tensor(targets, device=lp.device).view(-1, 1)).view(-1).tolist()
            r.position += k
            if r.feed:  # more of a forced run to feed
                continue
            if r.closing:
                r.done = True
            else:
                r.last = k - 1
                nxt.append(i)
        if not nxt:  # every live row still feeds a forced run
            continue
        scores = torch.stack([logits[i, rows[i].last] for i in nxt])
        raw = torch.log_softmax(scores, dim=-1) if want_logprobs else None
        held = [rows[i].matcher for i in nxt]  # a finished grammar allows only EOS; an errored matcher is left free
        masked = [j for j, m in enumerate(held) if m is not None and not m.is_error()]
        allowed = allowed_tokens([held[j] for j in masked], vocab).to(scores.device) if masked else None
        if readout is not None and masked:
            at = [(nxt[j], held[j], model_logits[nxt[j], rows[nxt[j]].last], allowed[a]) for a, j in enumerate(masked)
                  if readout.is_value_position(allowed[a])]
            for i, value in read_values(readout, at, branch).items():
                rows[i].readouts.append((len(rows[i].tokens), value))  # the index its first token gets below
        scores = mask_disallowed(scores, held, masked, allowed)
        if sample:
            if top_p_warp is not None:
                scores = top_p_warp(None, scores)
            picked = torch.multinomial(torch.softmax(scores, dim=-1), 1).view(-1)
        else:
            picked = scores.argmax(dim=-1)
        for j, i in enumerate(nxt):
            r, token = rows[i], int(picked[j])
            if raw is not None:
                r.logprobs.append(float(raw[j, token]))
            r.feed = [token]
            if add(r, token):
                r.done = True
                continue
            if r.matcher is not None and r.matcher.consume_token(token) and not r.matcher.is_error() \
                    and _fast_forward(r, add, vocab):
                r.closing = want_logprobs  # the forced run's log-probs need one more forward, unless nobody wants them
                r.done = not want_logprobs
    compact(cache, torch.cat(fed_mask, dim=1))
    tokens_c, mask_c = _compact_ids(torch.cat(fed_ids, dim=1), torch.cat(fed_mask, dim=1))
    return Decoded([r.tokens for r in rows], [r.logprobs for r in rows] if want_logprobs else None, forwards,
                   tokens_c, mask_c, [r.readouts for r in rows] if readout is not None else None)


def _fast_forward(row: _Row, add: Callable[[_Row, int], bool], vocab: int) -> bool:
    """Append the forced run after the row's newest token to what it feeds next; True when the run ends the row."""
    for forced in row.matcher.compute_ff_tokens():
        row.matcher.consume_token(forced)
        row.feed.append(forced)
        if add(row, forced):
            return True
    if row.matcher.is_stopped():  # a complete grammar allows only the end ids: forced when there is one
        allowed = torch.nonzero(allowed_tokens([row.matcher], vocab)[0]).view(-1)
        if len(allowed) == 1:
            row.feed.append(int(allowed[0]))
            add(row, int(allowed[0]))
            return True
    return False


def _real_columns(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, F]`` column indices of each row's real (mask 1) columns, right-aligned, and their mask."""
    counts = mask.sum(dim=1)
    width = int(counts.max()) if mask.numel() else 0
    index = torch.zeros((mask.shape[0], width), dtype=torch.long)
    keep = torch.zeros((mask.shape[0], width), dtype=torch.long)
    for i in range(mask.shape[0]):
        cols = torch.nonzero(mask[i].cpu()).view(-1)
        index[i, width - len(cols):] = cols
        keep[i, width - len(cols):] = 1
    return index, keep


def _compact_ids(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    index, keep = _real_columns(mask)
    return ids.cpu().gather(1, index) * keep, keep


def compact(cache: GrowingCache, mask: torch.Tensor) -> None:
    """Keep only each row's real columns of every layer, left-padded: the layout of a plain ``generate``.
    Layer by layer, so at most one layer's old buffer lives beside the new ones."""
    index, _ = _real_columns(mask)
    for li, layer in enumerate(cache.layers):
        k = layer.keys  # [N, H, C, D]
        idx = index.to(k.device).view(index.shape[0], 1, -1, 1)
        new_k = k.gather(2, idx.expand(k.shape[0], k.shape[1], -1, k.shape[-1]))
        new_v = layer.values.gather(2, idx.expand(k.shape[0], layer.values.shape[1], -1, layer.values.shape[-1]))
        fresh = GrowingLayer(new_k.shape[2])
        fresh.lazy_initialization(new_k[:, :, :1], new_v[:, :, :1])
        fresh._rebase(new_k, new_v, new_k.shape[2])
        cache.layers[li] = fresh
