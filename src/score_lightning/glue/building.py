"""Building what a SCORE step runs on: the policies, the rollout engines and the optimisers."""

from __future__ import annotations

import torch

from score_lightning.step.faults import guarded_step
from score_lightning.step.solver_update import OptimizerHooks


class BuildingHooks:
    """``configure_model``, ``setup`` and ``configure_optimizers`` of :class:`~score_lightning.module.ScoreModule`."""

    def configure_model(self) -> None:
        if self.policy is not None:
            return
        from score_lightning.policy.models import load_policy, load_reference

        m = self.cfg.model  # with model.lora the policy trains adapters only; its reference is a view of the base
        top = m.trainable_layers  # or only the top N layers (top_layers.py)
        self.policy = load_policy(self.model_path, m.dtype, m.gradient_checkpointing, lora=m.lora,
                                  trainable_layers=top)
        if float(self.cfg.loss.kl_coef) > 0:
            self.ref = load_reference(self.model_path, m.dtype, self.policy, trainable_layers=top)
        if not self.cfg.actor.shared:
            # a separate evaluator trains what the solver trains (model.trainable_layers: its top N layers too)
            self.evaluator_policy = load_policy(self.model_path, m.dtype, m.gradient_checkpointing,
                                                trainable_layers=top)
        if bool(self.cfg.solver.freeze):
            self.policy.requires_grad_(False)  # a frozen solver has no optimiser state and no gradient
        if self.cfg.strategy.name == "fsdp":
            from score_lightning.policy.fsdp import shard_models

            shard_models(self, self.cfg.strategy)

    @property
    def eval_model(self):
        return self.policy if self.evaluator_policy is None else self.evaluator_policy

    def setup(self, stage: str) -> None:
        from score_lightning.generation.engines import build_engines, collective_forwards
        from score_lightning.clients.limiter import configure_limits

        # this process's share of the run's judge.max_concurrency / requests_per_minute (ranks are known from here)
        configure_limits(self.cfg.judge, self.cfg.rollout, self.trainer.global_rank, self.trainer.world_size)
        self.generator.open_retriever()  # unless a test or script set one
        if self.prefetch is not None:  # rollout.mode=async: the worker loads its engines while the trainer sets up
            from score_lightning.generation.prefetch import worker_threads

            self.prefetch.threads = worker_threads(getattr(self, "thread_plan", None))
            self.prefetch.start(self.trainer.strategy.root_device)
        kind = str(self.cfg.rollout.engine)
        if self.engine is not None or (kind == "vllm" and self.prefetch is None):
            return  # rollout=vllm rollout.mode=sync: the vLLM callback installs its engine on fit start
        # rollout=vllm rollout.mode=async: the worker owns the vLLM engine; what the trainer still generates
        # (step judgements, preference pairs) runs on HF engines over its own modules (no weight copy)
        self.generator.use(build_engines(self.cfg.rollout, self.cfg.actor, self.tokenizer, lambda: self.policy,
                                         lambda: self.eval_model,
                                         kind="hf" if kind == "vllm" else kind,
                                         collective=collective_forwards(self.cfg.strategy, self.trainer.world_size)))

    def teardown(self, stage: str) -> None:
        self.close_workers()

    def close_workers(self) -> None:
        """Stop the asynchronous rollout worker (``rollout.mode=async``) and close what generating opened (the
        retriever, the judge's client); also called when fit raised."""
        if self.prefetch is not None:
            self.prefetch.close()
        self.generator.close()

    def configure_optimizers(self):
        """The solver's AdamW and the evaluator's own (lr = alpha * lr): see :mod:`score_lightning.step.optimizers`."""
        from score_lightning.step.optimizers import build_optimizers

        built = build_optimizers(self.cfg.optim, self.cfg.evaluator, self.policy, self.evaluator_policy)
        self._optimizer_index = {"solver": built.solver, "evaluator": built.evaluator}
        if not built.optimizers:  # frozen solver and no evaluator learning: nothing trains
            return None
        return built.optimizers, built.schedulers

    def optimizer_hooks(self, phase: str, model) -> OptimizerHooks:
        """What an update stage calls to backward and step ``phase``'s optimiser (``solver`` | ``evaluator``)."""
        opts = self.optimizers()
        opts = list(opts) if isinstance(opts, (list, tuple)) else [opts]
        opt = opts[self._optimizer_index[phase]]
        params = [p for p in model.parameters() if p.requires_grad]
        return OptimizerHooks(self.manual_backward, lambda: self._optimizer_step(opt, params, phase), self.device)

    def _optimizer_step(self, opt, params: list[torch.nn.Parameter], phase: str) -> tuple[float, bool]:
        """Test hook, fault injection, then clip / finite check / step (see ``guarded_step``)."""
        if self.pre_step_hook is not None:
            self.pre_step_hook(self, phase)
        if phase == "solver" and self.score_step in set(self.cfg.debug.nan_grad_steps or []):
            for p in params:  # fault injection (debug.nan_grad_steps): poison this update's gradients
                if p.grad is not None:
                    p.grad.fill_(float("nan"))
        norm, stepped = guarded_step(opt, params, float(self.cfg.optim.grad_clip))
        self.faults.record_update(stepped, phase, self.score_step)
        return norm, stepped

    def lr_scheduler_list(self) -> list:
        s = self.lr_schedulers()
        if s is None:
            return []
        return list(s) if isinstance(s, (list, tuple)) else [s]
