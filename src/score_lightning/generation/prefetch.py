"""The trainer's side of ``rollout.mode=async``: it asks the rollout worker for the next step's batch before
it updates on this one, and never trains on a batch more than ``rollout.max_staleness`` versions old.

Versions: the policy version of a set of weights is the number of SCORE steps whose updates they hold (the
trainer's ``score_step`` when it copied them). Step t trains the batch it takes with staleness t - version.
One batch is in flight at a time (the worker is one process; a deeper queue would not overlap more), so:

* ``max_staleness >= 1``: right after taking step t's batch, the trainer asks for step t+1's under its
  current weights (version t), then updates: batch t+1 arrives with staleness 1;
* ``max_staleness = 0``: nothing is asked ahead; step t asks for its own batch under version t and waits,
  which is synchronous training with the generation in the worker (bit for bit on a deterministic engine).

A batch that does not fit the step that takes it (another step or other queries, or older than
``max_staleness``, e.g. resumed with a smaller bound) is discarded and regenerated under the current
weights; ``rollout/discarded_batches`` counts them. Harness state, scheduler hints and the rubric source's
state travel with each request, so they reach the worker's prompts with the same delay as the weights.

Checkpoints: saving waits for the batch in flight and stores it (``generation/batch_codec.py``), so a resumed run
trains exactly the batch the uninterrupted one would have; batches are not regenerated from older weights,
which the checkpoint no longer holds.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import time

import torch
from multiprocessing.reduction import ForkingPickler
from omegaconf import OmegaConf

from score_lightning.generation.async_worker import GeneratedBatch, GenerationRequest, WorkerSpec, worker_main
from score_lightning.generation import batch_codec
from score_lightning.generation.generator import trajectory_versions
from score_lightning.step.scalars import StepScalars

log = logging.getLogger(__name__)

#: seconds the trainer waits for the worker to leave after asking it to, before killing it
CLOSE_TIMEOUT_S = 10.0


class WorkerFailed(RuntimeError):
    """The rollout worker raised (its traceback is the message) or died."""


class RolloutPrefetcher:
    """Starts the worker, sends it weights and requests, takes its batches, and checkpoints the one in flight."""

    def __init__(self, cfg, model_path: str, tokenizer_path: str, threads: int = 1):
        self.cfg = cfg
        self.max_staleness = int(cfg.rollout.max_staleness)
        self.model_path, self.tokenizer_path, self.threads = model_path, tokenizer_path, max(1, int(threads))
        self.proc = self.requests = self.results = None
        self.pid: int | None = None
        self.inflight: GenerationRequest | None = None
        self.ready: GeneratedBatch | None = None
        self.discarded = 0  # batches thrown away unused (cumulative, checkpointed)
        self.wait_s = 0.0  # time blocked on the worker since the last take
        self.weight_sync_s = 0.0  # time copying weights into the slots during this step
        self._sources: dict[str, dict[str, torch.Tensor]] | None = None
        self._slots: dict[str, dict[str, torch.Tensor]] = {}
        self._pushed: int | None = None
        self._stream = None

    # ------------------------------------------------------------------ process
    def start(self, device: torch.device | str = "cpu") -> None:
        """Spawn the worker (it loads its own engines while the trainer finishes its setup)."""
        if self.proc is not None:
            return
        ctx = torch.multiprocessing.get_context("spawn")
        self.requests, self.results = ctx.Queue(), ctx.Queue()
        device = torch.device(device)
        where = f"cuda:{device.index or 0}" if device.type == "cuda" else "cpu"
        spec = WorkerSpec(OmegaConf.to_container(self.cfg, resolve=True), self.model_path, self.tokenizer_path,
                          self.threads, os.getpid(), where)
        self.proc = ctx.Process(target=worker_main, args=(spec, self.requests, self.results), daemon=True,
                                name="score-rollout-worker")
        self.proc.start()
        self.pid = self.proc.pid
        _LIVE[self.pid] = (self.proc, self.requests)
        log.info("rollout worker started (pid %d, %d CPU thread%s, rollout.max_staleness=%d)", self.pid,
                 self.threads, "s" * (self.threads != 1), self.max_staleness)

    def close(self) -> None:
        """Ask the worker to leave, then kill it if it does not; idempotent."""
        if self.proc is not None:
            _stop(self.proc, self.requests)
            _LIVE.pop(self.pid, None)
            log.info("rollout worker stopped (pid %s, exit code %s)", self.pid, self.proc.exitcode)
        self.proc = self.requests = self.results = None
        self.inflight = None

    # ------------------------------------------------------------------ the step's batch
    def step_batch(self, module, batch: dict) -> GeneratedBatch:
        """Step ``module.score_step``'s batch (waiting for the worker as needed); then, under
        ``max_staleness >= 1``, the request for the next step's, before the update moves the weights."""
        self.weight_sync_s = 0.0
        got = self.take(module, batch, module.score_step)
        if self.max_staleness >= 1:
            following = self.following_batch(module, batch)
            if following is not None:
                self.submit(module, following, module.score_step + 1)
        return got

    def take(self, module, batch: dict, step: int) -> GeneratedBatch:
        """The batch for ``step`` (the one in flight if it fits, else a fresh one); ``info["wait_s"]``: the time
        the trainer was blocked on the worker since the last take (checkpoint saves included)."""
        got = self._settle()
        self.ready = None
        if got is not None and not self.fits(got, batch, step):
            self.discarded += 1
            log.warning("discarding the prefetched batch of step %d (policy version %d) at step %d: %s", got.step,
                        got.version, step, self.misfit(got, batch, step))
            got = None
        if got is None:
            self.submit(module, batch, step)
            got = self._settle()
            self.ready = None
        got.info["wait_s"], self.wait_s = self.wait_s, 0.0
        return got

    def fits(self, got: GeneratedBatch, batch: dict, step: int) -> bool:
        return self.misfit(got, batch, step) is None

    def misfit(self, got: GeneratedBatch, batch: dict, step: int) -> str | None:
        """Why ``got`` may not be trained at ``step`` on ``batch`` (``None``: it may)."""
        if got.step != step:
            return f"it was generated for step {got.step}"
        ids = [str(i) for i in batch.get("id", got.ids)]  # data, not config
        if list(got.prompts) != list(batch["prompt"]) or list(got.ids) != ids:
            return "the data stream served other queries"
        if step - got.version > self.max_staleness:
            return f"staleness {step - got.version} > rollout.max_staleness={self.max_staleness}"
        return None

    def following_batch(self, module, batch: dict) -> dict | None:
        """Batch number ``cursor`` of the query stream (a pure function of the seed and the cursor)."""
        dm = getattr(module.trainer, "datamodule", None)
        if batch.get("cursor") is None or dm is None or not hasattr(dm, "dataset"):
            return None
        if self._stream is None:
            self._stream = dm.dataset()
        return self._stream.batch(int(batch["cursor"]))

    def submit(self, module, batch: dict, step: int) -> None:
        """Ask for ``step``'s batch under the module's current weights and state (pickled now: the trainer
        goes on changing them)."""
        if self.inflight is not None:
            raise RuntimeError("a rollout request is already in flight")
        if self.proc is None:
            self.start(module.device)
        version = int(module.score_step)
        fresh = self._push_weights(module, version)
        ids = [str(i) for i in batch.get("id", range(len(batch["prompt"])))]  # data, not config
        req = GenerationRequest(step, version, ids, list(batch["prompt"]), module.harness_state, module.scheduler,
                                module.rubric_source.state_dict(), fresh)
        self.requests.put(("generate", bytes(ForkingPickler.dumps(req))))
        self.inflight = req

    def _push_weights(self, module, version: int) -> bool:
        """Copy the trainable tensors into the shared slots when they changed since the last push.
        Safe: one request in flight, and the worker copies the slots out before it starts generating."""
        if self.cfg.rollout.engine not in ("hf", "vllm") or self._pushed == version:
            return False
        t0 = time.perf_counter()
        if self._sources is None:
            roles = {"solver": module.policy}
            if getattr(module, "evaluator_policy", None) is not None:
                roles["evaluator"] = module.evaluator_policy
            self._sources = {role: {n: p for n, p in m.named_parameters() if p.requires_grad}
                             for role, m in roles.items()}
            self._slots = {role: {n: torch.empty(p.shape, dtype=p.dtype).share_memory_() for n, p in ps.items()}
                           for role, ps in self._sources.items()}
            self.requests.put(("slots", self._slots))
        with torch.no_grad():
            for role, params in self._sources.items():
                for name, p in params.items():
                    self._slots[role][name].copy_(p.detach())
        self._pushed = version
        self.weight_sync_s += time.perf_counter() - t0
        return True

    def _settle(self) -> GeneratedBatch | None:
        """The ready batch, after waiting for the one in flight if any."""
        if self.inflight is not None:
            t0 = time.perf_counter()
            self.ready = self._receive()
            self.inflight = None
            self.wait_s += time.perf_counter() - t0
        return self.ready

    def _receive(self) -> GeneratedBatch:
        while True:
            try:
                kind, payload = self.results.get(timeout=1.0)
            except queue.Empty:
                if not self.proc.is_alive():
                    raise WorkerFailed(f"the rollout worker (pid {self.pid}) died with exit code "
                                       f"{self.proc.exitcode}") from None
                continue
            if kind == "ready":
                engine, evaluator = payload.get("engine", "?"), payload.get("evaluator_engine", "?")  # data, not config
                log.info("rollout worker ready (pid %d, engine %s, %d CPU thread%s; evaluator engine %s)",
                         payload["pid"], engine, payload["threads"], "s" * (payload["threads"] != 1), evaluator)
            elif kind == "error":
                raise WorkerFailed(f"the rollout worker failed:\n{payload}")
            else:
                return payload

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """The batch in flight (waited for) as checkpoint-safe values, and the discard count."""
        got = self._settle()
        out: dict = {"discarded": self.discarded}
        if got is not None:
            out["batch"] = batch_codec.encode(got)
        return out

    def load_state_dict(self, state: dict) -> None:
        self.discarded = int(state.get("discarded", 0))
        self.ready = batch_codec.decode(state["batch"]) if "batch" in state else None


def record_async(sc: StepScalars, got: GeneratedBatch, step: int, discarded: int) -> None:
    """``rollout/staleness_mean`` and ``_max`` over what this step trains (solver trajectories and rubric
    samples, from their recorded versions), ``time/wait_s`` and ``rollout/discarded_batches``."""
    stale = [step - v for v in trajectory_versions(got.rollouts)]
    sc.mean("rollout/staleness_mean", float(sum(stale)), len(stale))
    sc.max("rollout/staleness_max", float(max(stale, default=0)))
    sc.max("time/wait_s", float(got.info.get("wait_s", 0.0)))
    sc.max("rollout/discarded_batches", float(discarded))


#: workers not yet closed (pid -> process, request queue), stopped at interpreter exit before multiprocessing's
#: own exit hook, which would SIGTERM them (ignored by design) and then wait forever
_LIVE: dict[int, tuple] = {}


@atexit.register
def _stop_all() -> None:
    for proc, requests in list(_LIVE.values()):
        _stop(proc, requests)
    _LIVE.clear()


def _stop(proc, requests, timeout: float = CLOSE_TIMEOUT_S) -> None:
    """Send the worker ``None``, wait ``timeout`` s, then SIGKILL it (it ignores SIGTERM by design)."""
    if proc.exitcode is None and proc.is_alive():
        try:
            requests.put(None)
        except (ValueError, OSError):  # queue already closed
            pass
        proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            proc.join(5.0)
    try:
        requests.cancel_join_thread()  # never block the trainer's exit on a dead worker's pipe
        requests.close()
    except (ValueError, OSError):
        pass


def worker_threads(plan) -> int:
    """The worker's share of ``threads.num`` (``launch/threads.py``), 1 when no plan was made."""
    return int(getattr(plan, "worker_threads", 0) or 1)

