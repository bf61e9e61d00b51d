"""HF transformers ``generate`` as a rollout engine, sharing the trainer's module (no weight copy).

Two things a real checkpoint brings that the tiny one does not:

* its ``generation_config.json`` carries sampling defaults (Qwen2.5-Instruct: repetition_penalty
  1.05, top_k 20, top_p 0.8) that ``generate`` would silently merge into every call. The policy
  would then sample from a distribution the trainer's log-probs (``softmax(logits / T)``) do not
  describe, and greedy output would differ from vLLM's. The engine generates with a blank
  generation config, so only what :class:`SamplingParams` says applies;
* stop strings: a tag is several tokens, and the token completing it may carry more text. HF's
  own ``stop_strings`` (``StopStringCriteria``) preprocesses the whole vocabulary on every call
  (its cache key is ``get_vocab()``'s key order, which differs between calls): 3-5 s per
  ``generate`` with a 152k vocabulary on CPU. :class:`_StopStrings` instead decodes a short
  window of each row's newest tokens per step and stops on the token that completes a string,
  the rule :func:`~score_lightning.rollout.stops.first_stop` applies afterwards to find the cut.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Sequence

import torch
from torch import nn
from transformers import (GenerationConfig, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList,
                          TemperatureLogitsWarper, TopPLogitsWarper)

from score_lightning.rollout.engine import Generation, SamplingParams
from score_lightning.rollout.constrained import GrammarLogitsProcessor
from score_lightning.rollout.kv_cache import GrowingCache, PrefixStore, prefill
from score_lightning.rollout.stops import completes_stop, first_stop, stop_window

if TYPE_CHECKING:
    from score_lightning.config.schema import HFRolloutConfig, RolloutConfig


def fast_forward_options(rollout: "HFRolloutConfig | RolloutConfig") -> dict:
    """``rollout.grammar_fast_forward`` and ``rollout.grammar_fast_forward_tokens`` as :class:`HFEngine` kwargs.
    Only ``rollout=hf`` and ``rollout=vllm`` (its HF evaluator engine) have these keys: a script that builds an HF
    engine under ``rollout=scripted`` (``scripts/probe_scoring.py``) gets the engine's own defaults."""
    if str(rollout.engine) not in ("hf", "vllm"):
        return {}
    return dict(fast_forward=bool(rollout.grammar_fast_forward),
                fast_forward_tokens=int(rollout.grammar_fast_forward_tokens))


class HFEngine:
    """Batched, left-padded generation with the KV cache, on whatever module the trainer holds.

    ``model_getter`` returns the current policy module, so the engine always samples from the
    latest weights and ``sync_weights`` has nothing to do.
    """

    def __init__(self, model_getter: Callable[[], nn.Module], pad_token_id: int, eos_token_id: int | Sequence[int],
                 tokenizer=None, max_batch_size: int = 64, collective: bool = False, fast_forward: bool = True,
                 fast_forward_tokens: int = 16, ignore_eos: bool = False):
        from score_lightning.policy.models import end_of_turn_ids

        self._model_getter = model_getter
        self.pad_token_id = pad_token_id
        eos = [int(eos_token_id)] if isinstance(eos_token_id, int) else [int(e) for e in eos_token_id]
        if tokenizer is not None:  # every end-of-turn id of the checkpoint (generation_config's EOS list too)
            eos += list(end_of_turn_ids(tokenizer))
        #: ids that end generation besides the per-call stop ids; the first is the primary EOS
        self.eos_token_ids = tuple(dict.fromkeys(eos))
        self.eos_token_id = self.eos_token_ids[0]
        self.tokenizer = tokenizer  # needed only for stop_strings
        self.max_batch_size = max_batch_size
        #: the module is FSDP-sharded over several processes: every forward is a collective, so every
        #: rank must make the same number of ``generate`` calls and decode in lockstep (``synced_gpus``)
        self.collective = collective
        #: the last calls' KV caches: a multi-turn row's next turn runs only its new tokens (rollout/kv_cache.py).
        #: Off for a collective (sharded) module: every rank must make the same forwards, whatever it has stored
        self.prefix_store = PrefixStore(0 if collective else 2 * max_batch_size)
        #: constrained calls feed the grammar's forced tokens in one forward (rollout/fast_forward.py); not for a
        #: collective module, whose ranks must make the same forwards
        self.fast_forward = fast_forward and not collective
        #: the most token columns x rows one such forward takes (forced runs beyond it wait for the next forward)
        self.fast_forward_tokens = int(fast_forward_tokens)
        #: every row runs to ``max_new_tokens``: EOS and every stop id are masked out of sampling (``generate``'s
        #: ``min_new_tokens``) and stop strings end nothing. For benchmarks that need equal-length completions
        #: (``scripts/bench_step.py --generator own``); no config key sets it. Log-probs stay those of the
        #: unmasked distribution. Unconstrained calls only
        self.ignore_eos = bool(ignore_eos)

    def release_cache(self) -> None:
        """Drop the stored KV caches (the trainer calls this before its update, when no rollout follows)."""
        self.prefix_store.entries.clear()

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:  # noqa: D401
        return None

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        out: list[Generation] = []
        if params.grammars and len(params.grammars) != len(prompts):
            raise ValueError(f"{len(params.grammars)} grammars for {len(prompts)} prompts")
        step = self.max_batch_size
        chunks = [prompts[s:s + step] for s in range(0, len(prompts), step)]
        if params.grammars:  # each chunk carries its own prompts' grammars
            chunk_params = [replace(params, grammars=tuple(params.grammars[s:s + step]))
                            for s in range(0, len(prompts), step)]
        else:
            chunk_params = [params] * len(chunks)
        if self.collective:  # ranks with fewer chunks (or none) join the others' forwards with a dummy prompt
            from score_lightning import distributed as D

            n = int(D.global_max(len(chunks)))
            dummy = SamplingParams(max_new_tokens=1, temperature=0.0, logprobs=False)
            for i in range(n):
                if i < len(chunks):
                    out.extend(self._generate_batch(chunks[i], chunk_params[i]))
                else:  # two columns: every rank makes the same prefill forward (kv_cache.prefill)
                    self._generate_batch([[self.eos_token_id] * 2], dummy)
            return out
        for chunk, p in zip(chunks, chunk_params):
            out.extend(self._generate_batch(chunk, p))
        return out

    def _generate_batch(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        model = self._model_getter()
        device = next(model.parameters()).device
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p):] = torch.as_tensor(list(p), dtype=torch.long)
            attention[i, width - len(p):] = 1
        input_ids, attention = input_ids.to(device), attention.to(device)
        eos = sorted({*self.eos_token_ids, *params.stop_token_ids})
        constrained = any(g is not None for g in params.grammars)
        if constrained and self.ignore_eos:
            raise ValueError("HFEngine(ignore_eos=True) runs unconstrained calls only (a grammar decides where "
                             "a constrained turn ends)")
        if self.fast_forward and width >= 2 and constrained:
            return self._decode_constrained(model, input_ids, attention, params, eos)
        if params.value_readout and constrained:
            raise ValueError("evaluator.score_readout=expected: the expected values are read by the grammar "
                             "fast-forward decoder, which this engine does not run (rollout.grammar_fast_forward="
                             f"{self.fast_forward}, sharded module: {self.collective}); use score_readout=sampled")
        sample = params.temperature > 0
        kwargs = dict(
            input_ids=input_ids, attention_mask=attention, max_new_tokens=params.max_new_tokens,
            do_sample=sample, eos_token_id=eos, pad_token_id=self.pad_token_id, use_cache=True,
            return_dict_in_generate=True, synced_gpus=self.collective,
        )
        if sample:
            kwargs.update(temperature=params.temperature, top_p=params.top_p, top_k=0)
        if self.ignore_eos:  # every id of `eos` masked until the last new token: no row ends early
            kwargs.update(min_new_tokens=params.max_new_tokens)
        if any(r is not None for r in params.grammars):
            # the mask must come before temperature and top-p (generate appends custom processors after its own)
            procs = [GrammarLogitsProcessor(params.grammars, self.tokenizer, self.eos_token_ids, width)]
            if sample:
                procs += [TemperatureLogitsWarper(params.temperature)] * (params.temperature != 1.0)
                procs += [TopPLogitsWarper(params.top_p)] * (params.top_p < 1.0)
                kwargs.update(temperature=1.0, top_p=1.0)
            kwargs.update(logits_processor=LogitsProcessorList(procs))
        if params.stop_strings and not self.ignore_eos:
            if self.tokenizer is None:
                raise ValueError("HFEngine needs the tokenizer to stop on strings (multi-token tags)")
            kwargs.update(stopping_criteria=StoppingCriteriaList(
                [_StopStrings(self.tokenizer.decode, params.stop_strings, width)]))
        was_training = model.training
        model.eval()
        # the KV cache is written in place, and a prompt shared by several rows (the K rollouts of a query) runs once
        kwargs["past_key_values"] = cache = GrowingCache(width + params.max_new_tokens)
        recorder = _SampledLogprobs(params.temperature if sample else 1.0) if params.logprobs else None
        handle = None
        self.prefix_store.check_weights(model)
        try:
            if width >= 2:
                prefill(model, input_ids, attention, cache, self.prefix_store)
            handle = model.register_forward_hook(recorder, with_kwargs=True) if recorder is not None else None
            with _blank_generation_config(model):
                res = model.generate(**kwargs)
        finally:
            if handle is not None:
                handle.remove()
            model.train(was_training)
        res.past_key_values = None
        self.prefix_store.add(cache, res.sequences, attention)
        del cache, kwargs["past_key_values"]
        new = res.sequences[:, width:].cpu()
        lp = recorder.finish(res.sequences[:, width:]) if recorder is not None and new.shape[1] else None
        if self.ignore_eos:
            eos, params = [], replace(params, stop_strings=())
        return self._cut(new.tolist(), lp.tolist() if lp is not None else None, eos, params.stop_strings)

    def _cut(self, rows: list[list[int]], logprobs: list[list[float]] | None, eos: Sequence[int],
             stop_strings: Sequence[str], readouts: list[list[tuple[int, float]]] | None = None) -> list[Generation]:
        """Each row's turn up to and including its stop (``stops.first_stop``), with its log-probs (and the
        expected score values read inside it: ``extra["value_readouts"]``, ``(token index, value)``)."""
        decode = self.tokenizer.decode if self.tokenizer is not None else None
        gens = []
        for i, row in enumerate(rows):
            n = first_stop(row, decode, eos, stop_strings)
            ids = row if n is None else row[:n]
            gen = Generation(ids, logprobs[i][:len(ids)] if logprobs is not None else None,
                             "length" if n is None else "stop")
            if readouts is not None:
                gen.extra["value_readouts"] = [(k, v) for k, v in readouts[i] if k < len(ids)]
            gens.append(gen)
        return gens

    def _decode_constrained(self, model: nn.Module, input_ids: torch.Tensor, attention: torch.Tensor,
                            params: SamplingParams, eos: list[int]) -> list[Generation]:
        """A constrained call by :func:`~score_lightning.rollout.fast_forward.grammar_decode` (forced runs in one
        forward); the same prefill, prefix store and turn cut as ``generate``."""
        from score_lightning.rollout.fast_forward import grammar_decode
        from score_lightning.rollout.value_readout import value_readout

        width = input_ids.shape[1]
        vocab = int(model.get_output_embeddings().weight.shape[0])
        readout = value_readout(self.tokenizer, vocab) if params.value_readout else None
        was_training = model.training
        model.eval()
        cache = GrowingCache(width + params.max_new_tokens)
        self.prefix_store.check_weights(model)
        try:
            prefill(model, input_ids, attention, cache, self.prefix_store)
            out = grammar_decode(model, input_ids, attention, cache, params.grammars, self.tokenizer,
                                 max_new_tokens=params.max_new_tokens, temperature=params.temperature,
                                 top_p=params.top_p,
                                 stop_ids=eos, stop_strings=params.stop_strings, eos_ids=self.eos_token_ids,
                                 pad_id=self.pad_token_id, want_logprobs=params.logprobs,
                                 max_forward_tokens=self.fast_forward_tokens, readout=readout)
        finally:
            model.train(was_training)
        self.prefix_store.add(cache, out.cache_tokens, out.cache_mask)
        return self._cut(out.tokens, out.logprobs, eos, params.stop_strings, out.readouts)


class _StopStrings(StoppingCriteria):
    """Stops a row on the generated token that completes one of ``strings`` (prompt text excluded;
    :func:`~score_lightning.rollout.stops.completes_stop` on each row's newest tokens)."""

    def __init__(self, decode: Callable[[list[int]], str], strings: Sequence[str], prompt_width: int):
        self.decode, self.strings, self.start = decode, tuple(strings), prompt_width
        self.window = stop_window(self.strings)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        new = input_ids[:, self.start:]
        tail = new[:, -self.window:].tolist() if new.shape[1] else [[] for _ in range(new.shape[0])]
        done = [completes_stop(self.decode, ids, self.strings, self.window) for ids in tail]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


@contextlib.contextmanager
def _blank_generation_config(model: nn.Module) -> Iterator[None]:
    """Generate without the checkpoint's sampling defaults (see the module docstring); restored after."""
    saved = getattr(model, "generation_config", None)
    if saved is None:
        yield
        return
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = saved


class _SampledLogprobs:
    """Forward hook recording each sampled token's log-prob under ``softmax(raw logits / T)``.

    ``generate(output_logits=True)`` would keep every step's ``[B, V]`` logits until the end, i.e.
    ``B x T x V`` floats (gigabytes for a real vocabulary and long responses). This hook sees the
    model's raw (pre-processor) logits at each decoding step, keeps that step's log-softmax only
    until the next step's input reveals the sampled token, and so holds one ``[B, V]`` block.
    """

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.prev: torch.Tensor | None = None
        self.cols: list[torch.Tensor] = []

    def _take(self, tokens: torch.Tensor) -> None:
        self.cols.append(self.prev.gather(-1, tokens.to(self.prev.device).view(-1, 1)).squeeze(-1))
        self.prev = None

    def __call__(self, module, args, kwargs, output) -> None:
        if self.prev is not None:  # this call's last input id is the token sampled from the previous step
            ids = kwargs.get("input_ids", args[0] if args else None)
            self._take(ids[:, -1])
        logits = output.logits[:, -1, :].float()
        if self.temperature != 1.0:
            logits = logits / self.temperature
        self.prev = torch.log_softmax(logits, dim=-1)  # a new tensor: later in-place processors cannot touch it

    def finish(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """One column per new token. Under ``synced_gpus`` a rank that finished first keeps running forwards
        until every rank is done; those come after its last token and their columns are dropped."""
        n = new_tokens.shape[1]
        if self.prev is not None and len(self.cols) < n:
            self._take(new_tokens[:, len(self.cols)])
        if len(self.cols) < n:
            raise RuntimeError(f"recorded {len(self.cols)} decoding steps for {n} new tokens")
        return torch.stack(self.cols[:n], dim=1).cpu()
