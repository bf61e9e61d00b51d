"""The asynchronous rollout worker (``rollout.mode=async``): a process of its own that generates SCORE step
t+1's batch (evidence, rubric, K solver rollouts per query, scoring, rewards, dynamic sampling's draws)
while the trainer updates on step t's.

Why a process and not a thread: generation is Python-heavy (the agent loop, retrieval, parsing) and
would hold the trainer's GIL; a process with its own model copy and its own CPU threads overlaps for
real (two 1-thread torch processes on 2 cores take ~1.2x one alone, NOTES.md). It is started with
``spawn`` (a fork of a process holding OpenMP threads and open files is not safe).

What crosses, and when (:mod:`score_lightning.generation.prefetch` is the trainer's side):

* once: a :class:`WorkerSpec` (the resolved config, the model path, its CPU threads) and, for the HF and
  vLLM engines, shared-memory *slots* holding a copy of each trainable tensor (all weights, the top layers
  or the LoRA adapters: whatever ``requires_grad``). Under ``rollout=vllm`` the worker owns a vLLM engine
  of its own (the trainer then holds none); its HF copy of the solver is where the slots land, and after
  each copy its weights (LoRA merged) are loaded into vLLM as the synchronous callback loads them;
* per batch: a :class:`GenerationRequest` (step, policy version, the queries, the harness state, the
  dimension scheduler, the rubric source's state; a flag when the slots hold new weights), pickled by the
  trainer before it moves on. The answer is a :class:`GeneratedBatch`.

Determinism: before each batch the worker seeds its generators from ``(seed, step)`` (``rng.seed_request``),
so the batch of step t is a pure function of the seed, t, the weights of its version and the states sent.
The worker never outlives the trainer: it is a daemon, dies with its parent (``PR_SET_PDEATHSIG`` on Linux,
and a watcher that polls the parent's pid), and ignores SIGTERM/SIGINT/SIGUSR1, which are the trainer's to
handle (a preempted trainer still needs the in-flight batch for its checkpoint).
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import signal
import sys
import threading
import time
import traceback
from contextlib import nullcontext
from dataclasses import dataclass, field

from score_lightning.generation.engines import build_engines
from score_lightning.generation.generator import RunAccess, build_generator, stamp_policy_version

log = logging.getLogger(__name__)

#: how often the worker checks that its parent still lives while it waits for work
PARENT_POLL_S = 0.5


@dataclass
class WorkerSpec:
    """What the worker needs to build its engines: sent once, at start."""

    cfg: dict  # the run's resolved config (OmegaConf.to_container)
    model_path: str
    tokenizer_path: str
    threads: int  # torch intra-op threads of the worker (launch/threads.py splits threads.num)
    parent_pid: int
    device: str = "cpu"


@dataclass
class GenerationRequest:
    """One batch to generate: the step it is for and the state the trainer had when it asked."""

    step: int
    version: int  # SCORE steps whose updates the weights hold (the trainer's score_step when it asked)
    ids: list[str]
    prompts: list[str]
    harness_state: object  # HarnessState
    scheduler: object  # DimensionScheduler (its hints shape the rubric prompt)
    rubric_state: dict
    weights: bool = False  # the slots hold this version's trainable tensors: copy them in first


@dataclass
class GeneratedBatch:
    """A step's generated batch, as ``training_step`` consumes it; also what a checkpoint stores."""

    step: int
    version: int
    ids: list[str]
    prompts: list[str]
    rollouts: object  # StepRollouts (every trajectory and rubric sample stamped with ``version``)
    rewards: object  # StepRewards
    drawn: tuple  # dynamic sampling's (groups without signal, groups drawn, draws)
    rollout_s: float = 0.0
    scoring_s: float = 0.0
    info: dict = field(default_factory=dict)


class WorkerHost:
    """The worker's generator (built as the trainer's is, by ``build_generator``), its engines and its model copies;
    the harness state, scheduler and step it generates under are the latest request's."""

    def __init__(self, spec: WorkerSpec):
        from omegaconf import OmegaConf

        from score_lightning.harness.state import HarnessState
        from score_lightning.clients.limiter import configure_limits

        cfg = self.cfg = OmegaConf.create(spec.cfg)
        self.spec = spec
        # the worker's share of the run's limits (beside one training process)
        configure_limits(cfg.judge, cfg.rollout, 0, 1, worker=True)
        self.score_step = 0
        self.harness_state = HarnessState.from_dict(OmegaConf.to_container(cfg.harness.initial_state, resolve=True))
        self.scheduler = None
        self._extra = None
        self.generator = build_generator(cfg, spec.tokenizer_path, RunAccess(
            lambda: self.harness_state, lambda: self.scheduler, lambda: self.score_step, self._extra_stream))
        self.generator.open_retriever()
        self.models: dict = {}  # role -> module (HF and vLLM engines: under vLLM the slots' target)
        self.slots: dict = {}  # role -> {name: shared tensor}, set by the trainer's first message
        self.vllm = None  # rollout=vllm: the worker's own engine, loaded from the solver model's weights
        self.last_sync_s = 0.0  # rollout=vllm: the last load of the solver's weights into it
        self.generator.use(self._engines())

    def _engines(self):
        """The worker's engines (``build_engines``), over model copies of its own for HF and vLLM."""
        c = self.cfg
        if c.rollout.engine not in ("hf", "vllm", "scripted"):
            raise ValueError(f"rollout.mode=async has no worker for rollout.engine={c.rollout.engine!r}")
        solver = evaluator = None
        if c.rollout.engine != "scripted":
            from score_lightning.policy.models import load_policy

            m, top = c.model, c.model.trainable_layers
            solver = load_policy(self.spec.model_path, m.dtype, False, lora=m.lora, trainable_layers=top)
            evaluator = solver if bool(c.actor.shared) else load_policy(self.spec.model_path, m.dtype, False,
                                                                       trainable_layers=top)
            self.models = {"solver": solver, "evaluator": evaluator}
            for model in {id(x): x for x in self.models.values()}.values():
                model.requires_grad_(False)
                model.to(self.spec.device)
        engines = build_engines(c.rollout, c.actor, self.generator.tokenizer, lambda: solver, lambda: evaluator,
                                vllm=lambda: _vllm_engine(self.spec, c))
        self.vllm = engines.vllm
        return engines

    def _extra_stream(self):
        """Dynamic sampling's own query stream, as the trainer's (one process: rank 0 of 1)."""
        if self._extra is None:
            from score_lightning.data.datamodule import QueryStream
            from score_lightning.data.queries import load_queries
            from score_lightning.step.dynamic_sampling import EXTRA_STREAM_SEED

            d = self.cfg.data
            self._extra = QueryStream(load_queries(d.queries_path, d.split), int(d.batch_size),
                                      int(self.cfg.seed) + EXTRA_STREAM_SEED, 0, 0, 1)
        return self._extra

    def load_weights(self) -> None:
        """Copy the slots into the models in place (which also invalidates the HF engines' stored KV caches);
        under ``rollout=vllm``, then push the solver model into the vLLM engine as the synchronous callback
        does (every weight, LoRA merged; ``rollout/vllm_weights.py``)."""
        import torch

        with torch.no_grad():
            for role, slots in self.slots.items():
                params = dict(self.models[role].named_parameters())
                for name, tensor in slots.items():
                    params[name].copy_(tensor)
        if self.vllm is not None:
            from score_lightning.rollout.vllm_weights import push_policy_weights

            self.last_sync_s = push_policy_weights(self.vllm, self.models["solver"])

    def generate(self, req: GenerationRequest) -> GeneratedBatch:
        from score_lightning.rng import seed_request

        if req.weights:
            self.load_weights()
        self.harness_state, self.scheduler = req.harness_state, req.scheduler
        self.generator.rubric_source.load_state_dict(req.rubric_state)
        self.score_step = req.step
        seed_request(int(self.cfg.seed), req.step)
        t0 = time.perf_counter()
        with self._precision():
            ro = self.generator.rollout(list(req.prompts), list(req.ids))
            t1 = time.perf_counter()
            rw = self.generator.score(ro)
            ro, rw, drawn = self.generator.draw_until_informative(ro, rw)
        stamp_policy_version(ro, req.version)
        return GeneratedBatch(req.step, req.version, list(req.ids), list(req.prompts), ro, rw, drawn,
                              t1 - t0, time.perf_counter() - t1,
                              {"pid": os.getpid(), "harness_version": int(getattr(req.harness_state, "version", -1))})

    def _precision(self):
        """The trainer's autocast, when its precision is bf16-mixed (its own generation would run under it)."""
        if str(self.cfg.trainer.precision) != "bf16-mixed" or not self.models:
            return nullcontext()
        import torch

        return torch.autocast(self.spec.device.split(":")[0], dtype=torch.bfloat16)


def _vllm_engine(spec: WorkerSpec, cfg):
    """The worker's vLLM engine, from the same ``rollout`` keys as the synchronous one. Its CPU threads are the
    worker's share: the engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so its kernels use
    the OpenMP and torch thread counts :func:`worker_main` set, and no core binding of vLLM's own applies
    (``VLLM_CPU_OMP_THREADS_BIND=nobind``)."""
    from omegaconf import OmegaConf

    from score_lightning.rollout.vllm_engine import VLLMEngine
    from score_lightning.rollout.vllm_weights import engine_kwargs

    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    rollout = OmegaConf.to_container(cfg.rollout, resolve=True)
    return VLLMEngine(spec.model_path, **engine_kwargs(rollout, int(cfg.seed)))


def worker_main(spec: WorkerSpec, requests, results) -> None:
    """The worker's loop: build, say ready, then answer each request in order until ``None`` (or the parent dies)."""
    _follow_parent(spec.parent_pid)
    for name in ("SIGTERM", "SIGINT", "SIGUSR1"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    os.environ["OMP_NUM_THREADS"] = os.environ["RAYON_NUM_THREADS"] = str(spec.threads)
    import torch

    torch.set_num_threads(spec.threads)
    try:
        from score_lightning.telemetry.console import quiet_console

        quiet_console()  # no weight-loading bars from the worker either
        host = WorkerHost(spec)
    except BaseException:  # noqa: BLE001 - the trainer raises it with this traceback
        results.put(("error", traceback.format_exc()))
        return
    results.put(("ready", {"pid": os.getpid(), "threads": torch.get_num_threads(),
                           "engine": type(host.generator.engine).__name__,
                           "evaluator_engine": type(host.generator.evaluator_engine).__name__}))
    serve(host, requests, results, spec.parent_pid)


def serve(host: WorkerHost, requests, results, parent_pid: int) -> None:
    """Answer each request in order until ``None`` (or the parent is gone), then close what generating opened (an
    MCP stdio server, the judge's client) before the process ends."""
    try:
        while True:
            msg = _next(requests, parent_pid)
            if msg is None:
                return
            kind, payload = msg
            if kind == "slots":
                host.slots = payload
                continue
            try:
                results.put(("batch", host.generate(pickle.loads(payload))))
            except BaseException:  # noqa: BLE001
                results.put(("error", traceback.format_exc()))
    finally:
        host.generator.close()


def _next(requests, parent_pid: int):
    """The next message; ``None`` on the trainer's ``None`` or when the trainer is gone."""
    while True:
        try:
            return requests.get(timeout=PARENT_POLL_S)
        except queue.Empty:
            if os.getppid() != parent_pid:
                return None


def _follow_parent(parent_pid: int) -> None:
    """Die with the trainer even when it is SIGKILLed (no atexit runs then): the kernel's parent-death
    signal where Linux offers it, and a thread that polls the parent's pid everywhere."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(0)

    def watch() -> None:
        while True:
            time.sleep(PARENT_POLL_S)
            if os.getppid() != parent_pid:
                os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
