"""HF transformers ``generate`` as a rollout engine, sharing the trainer's module (no weight copy)."""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import torch
from torch import nn

from score_lightning.rollout.engine import Generation, SamplingParams


class HFEngine:
    """Batched, left-padded generation with the KV cache, on whatever module the trainer holds.

    ``model_getter`` returns the current policy module, so the engine always samples from the
    latest weights and ``sync_weights`` has nothing to do.
    """

    def __init__(self, model_getter: Callable[[], nn.Module], pad_token_id: int, eos_token_id: int,
                 tokenizer=None, max_batch_size: int = 64, collective: bool = False):
        self._model_getter = model_getter
        self.pad_token_id = pad_token_id
        self.eos_token_id = eos_token_id
        self.tokenizer = tokenizer  # needed only for stop_strings
        self.max_batch_size = max_batch_size
        #: the module is FSDP-sharded over several processes: every forward is a collective, so every
        #: rank must make the same number of ``generate`` calls and decode in lockstep (``synced_gpus``)
        self.collective = collective

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:  # noqa: D401
        return None

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        out: list[Generation] = []
        chunks = [prompts[s:s + self.max_batch_size] for s in range(0, len(prompts), self.max_batch_size)]
        if self.collective:  # ranks with fewer chunks (or none) join the others' forwards with a dummy prompt
            from score_lightning import distributed as D

            n = int(D.global_max(len(chunks)))
            dummy = SamplingParams(max_new_tokens=1, temperature=0.0, logprobs=False)
            for i in range(n):
                if i < len(chunks):
                    out.extend(self._generate_batch(chunks[i], params))
                else:
                    self._generate_batch([[self.eos_token_id]], dummy)
            return out
        for chunk in chunks:
            out.extend(self._generate_batch(chunk, params))
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
        eos = sorted({self.eos_token_id, *params.stop_token_ids})
        sample = params.temperature > 0
        kwargs = dict(
            input_ids=input_ids, attention_mask=attention, max_new_tokens=params.max_new_tokens,
            do_sample=sample, eos_token_id=eos, pad_token_id=self.pad_token_id, use_cache=True,
            return_dict_in_generate=True, synced_gpus=self.collective,
        )
        if sample:
            kwargs.update(temperature=params.temperature, top_p=params.top_p, top_k=0)
        if params.stop_strings:
            kwargs.update(stop_strings=list(params.stop_strings), tokenizer=self.tokenizer)
        was_training = model.training
        model.eval()
        recorder = _SampledLogprobs(params.temperature if sample else 1.0) if params.logprobs else None
        handle = model.register_forward_hook(recorder, with_kwargs=True) if recorder is not None else None
        try:
            res = model.generate(**kwargs)
        finally:
            if handle is not None:
                handle.remove()
            model.train(was_training)
        new = res.sequences[:, width:].cpu()
        lp = recorder.finish(res.sequences[:, width:]) if recorder is not None and new.shape[1] else None
        gens = []
        stops = set(eos)
        for i in range(new.shape[0]):
            row = new[i].tolist()
            n = len(row)
            finish = "length"
            for j, t in enumerate(row):
                if t in stops:
                    n, finish = j + 1, "stop"
                    break
            if finish == "length" and params.stop_strings and self.tokenizer is not None:
                # rows stopped by a stop string are right-padded by generate(): strip the padding
                while n and row[n - 1] == self.pad_token_id:
                    n -= 1
                if any(self.tokenizer.decode(row[:n]).endswith(s) for s in params.stop_strings):
                    finish = "stop"
            ids = row[:n]
            gens.append(Generation(ids, lp[i, :n].tolist() if lp is not None else None, finish))
        return gens


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
        if self.prev is not None:
            self._take(new_tokens[:, len(self.cols)])
        if len(self.cols) != new_tokens.shape[1]:
            raise RuntimeError(f"recorded {len(self.cols)} decoding steps for {new_tokens.shape[1]} new tokens")
        return torch.stack(self.cols, dim=1).cpu()
