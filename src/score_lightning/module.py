"""``ScoreModule``: one SCORE step per ``training_step``, as Lightning glue around the step stages.

Step t (Algorithm 1; each stage lives in :mod:`score_lightning.step`): initial evidence -> one
rubric for the global batch -> K solver rollouts per query -> scoring -> rewards (gates, verifier)
-> Phase 1 solver GRPO -> evaluator reward + EMA -> Phase 2 evaluator REINFORCE (every U) ->
scheduler statistics -> logging. ``score_step`` counts SCORE steps, and Lightning's ``global_step``
is kept equal to it (see :meth:`_advance_global_step`), so ``trainer.max_steps``, checkpoint
intervals, the harness period and the TensorBoard x-axis all count SCORE steps.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from lightning.pytorch import LightningModule
from omegaconf import DictConfig, OmegaConf

from score_lightning import distributed as D
from score_lightning.errors import TrainingHalted
from score_lightning.harness.scheduler import DimensionScheduler
from score_lightning.harness.state import HarnessState
from score_lightning.harness.stats_window import StatsWindow
from score_lightning.loggers import add_score_layout
from score_lightning.rewards.functions import EMABaseline
from score_lightning.rng import rng_state, seed_rank, set_rng_state
from score_lightning.rubrics.base import RubricContext
from score_lightning.step.evaluator_phase import centre, sample_rewards
from score_lightning.step.evaluator_update import ReinforceSettings, evaluator_update
from score_lightning.step.evaluations import group_evaluations
from score_lightning.step.faults import FaultMonitor, guarded_step
from score_lightning.step.record import record_rewards, record_rollouts, record_solver_update
from score_lightning.step.report import global_values, report_distributions, report_texts, throughput
from score_lightning.step.reward_assembly import RewardSettings, StepRewards, assemble_rewards, parse_answers
from score_lightning.step.rollouts import RolloutSettings, initial_evidence, scoring_rollouts, solver_rollouts
from score_lightning.step.samples import step_samples
from score_lightning.step.scalars import StepScalars
from score_lightning.step.solver_update import GRPOSettings, OptimizerHooks, solver_update
from score_lightning.step.step_rewards import StepRewardStage
from score_lightning.step.types import StepRollouts
from score_lightning.top_layers import update_scope

log = logging.getLogger(__name__)

class ScoreModule(LightningModule):
    """The SCORE trainer. ``cfg`` is the full Hydra config (validated before construction)."""

    def __init__(self, cfg: DictConfig | dict, model_path: str, tokenizer_path: str | None = None):
        super().__init__()
        self.automatic_optimization = False
        cfg = OmegaConf.create(cfg) if isinstance(cfg, dict) else cfg
        self.save_hyperparameters({"cfg": OmegaConf.to_container(cfg, resolve=True), "model_path": model_path,
                                   "tokenizer_path": tokenizer_path or model_path})
        self.cfg, self.model_path = cfg, model_path
        from score_lightning.models import load_tokenizer

        self.tokenizer = load_tokenizer(tokenizer_path or model_path, chat_template=cfg.model.get("chat_template"))
        self.K = int(cfg.solver.num_rollouts)
        self.score_step = self.data_cursor = 0
        self._harness_state = HarnessState.from_dict(OmegaConf.to_container(cfg.harness.initial_state, resolve=True))
        scheduler_cfg = OmegaConf.to_container(cfg.harness.get("scheduler") or {}, resolve=True)
        self.scheduler = DimensionScheduler(list(self._harness_state.dimension_pool), **scheduler_cfg)
        self.baseline = EMABaseline(float(cfg.evaluator.ema_beta))
        self.faults = FaultMonitor(int(cfg.optim.max_consecutive_skips), int(cfg.retriever.max_failed_steps),
                                   str(cfg.retriever.get("url") or "the retriever"))
        self.stats_window = StatsWindow(int(cfg.harness.every_n_steps))
        self._pending_rng: dict | None = None
        from hydra.utils import instantiate

        self.rubric_source = instantiate(cfg.rubric, _convert_="all")  # score | evolving | given (configs/rubric/)
        self.preference = instantiate(cfg.evaluator.preference, _convert_="all") \
            if str(cfg.evaluator.reward) == "preference" else None
        self.rollout_settings = RolloutSettings.from_cfg(cfg)
        self.reward_settings = RewardSettings.from_cfg(cfg)
        self.grpo_settings = GRPOSettings.from_cfg(cfg)
        self.reinforce_settings = ReinforceSettings.from_cfg(cfg)
        self.step_stage = StepRewardStage.from_cfg(cfg)  # reward.step=rubric: ARCO-style step judgements
        self.policy = self.evaluator_policy = self.ref = None
        self.engine = self.evaluator_engine = None  # set in setup() (HF, scripted) or by the vLLM callback
        self.retriever = None
        #: test hook: called with (module, phase) before each optimiser step; may poison gradients
        self.pre_step_hook: Callable[["ScoreModule", str], None] | None = None
        #: the current step's rollouts (for ``pre_step_hook``), and the last step's rollouts, rewards
        #: and evaluator signal (tests and drills read them)
        self.step_rollouts: StepRollouts | None = None
        self.last_step: dict | None = None

    # ------------------------------------------------------------------ harness state
    @property
    def harness_state(self) -> HarnessState:
        return self._harness_state

    @harness_state.setter
    def harness_state(self, state: HarnessState) -> None:
        """A refresh may edit the dimension pool; the scheduler follows it."""
        if list(state.dimension_pool) != list(self._harness_state.dimension_pool):
            self.scheduler.set_pool(list(state.dimension_pool))
        self._harness_state = state

    def set_harness_window(self, steps: int) -> None:
        """The meta-harness callback's period M: its statistics are means over the last M steps."""
        self.stats_window.resize(steps)

    def harness_stats(self) -> dict[str, float]:
        """Means over the last M steps, plus dimension frequencies: what the meta-harness reacts to."""
        stats = self.stats_window.means()
        stats.update({f"dims/{name}_freq": float(f) for name, f in self.scheduler.frequencies().items()})
        return stats

    # ------------------------------------------------------------------ building
    def configure_model(self) -> None:
        if self.policy is not None:
            return
        from score_lightning.models import load_policy, load_reference

        m = self.cfg.model  # with model.lora the policy trains adapters only; its reference is a view of the base
        top = m.get("trainable_layers")  # or only the top N layers (top_layers.py)
        self.policy = load_policy(self.model_path, m.dtype, m.gradient_checkpointing, lora=m.get("lora"),
                                  trainable_layers=top)
        if float(self.cfg.loss.kl_coef) > 0:
            self.ref = load_reference(self.model_path, m.dtype, self.policy, trainable_layers=top)
        if not self.cfg.actor.shared:
            self.evaluator_policy = load_policy(self.model_path, m.dtype, m.gradient_checkpointing)
        if bool(self.cfg.solver.freeze):
            self.policy.requires_grad_(False)  # a frozen solver has no optimiser state and no gradient
        if self.cfg.strategy.name == "fsdp":
            from score_lightning.fsdp import shard_models

            shard_models(self, self.cfg.strategy)

    @property
    def eval_model(self):
        return self.policy if self.evaluator_policy is None else self.evaluator_policy

    def setup(self, stage: str) -> None:
        from score_lightning.retrieval.from_config import retriever_from_config

        if self.retriever is None:
            self.retriever = retriever_from_config(self.cfg.retriever, self.cfg.paths.cache_dir)
        if self.engine is not None:
            return
        tok, kind = self.tokenizer, self.cfg.rollout.engine
        if kind == "hf":
            from score_lightning.rollout.hf_engine import HFEngine, fast_forward_options

            sharded = self.cfg.strategy.name == "fsdp" and self.trainer.world_size > 1  # forwards are collective
            args = (tok.pad_token_id, tok.eos_token_id, tok, int(self.cfg.rollout.max_batch_size), sharded)
            ff = fast_forward_options(self.cfg.rollout)
            self.engine = HFEngine(lambda: self.policy, *args, **ff)
            self.evaluator_engine = HFEngine(lambda: self.eval_model, *args, **ff)
        elif kind == "scripted":
            from hydra.utils import instantiate

            from score_lightning.rollout.scripted import ScriptedEngine

            self.engine = self.evaluator_engine = ScriptedEngine(tok, instantiate(self.cfg.rollout.responder))

    def configure_optimizers(self):
        """The solver's AdamW and the evaluator's own (lr = alpha * lr): see :mod:`score_lightning.optimizers`."""
        from score_lightning.optimizers import build_optimizers

        built = build_optimizers(self.cfg, self.policy, self.evaluator_policy)
        self._optimizer_index = {"solver": built.solver, "evaluator": built.evaluator}
        if not built.optimizers:  # frozen solver and no evaluator learning: nothing trains
            return None
        return built.optimizers, built.schedulers

    # ------------------------------------------------------------------ optimiser glue
    def _hooks(self, phase: str, model) -> OptimizerHooks:
        opts = self.optimizers()
        opts = list(opts) if isinstance(opts, (list, tuple)) else [opts]
        opt = opts[self._optimizer_index[phase]]
        params = [p for p in model.parameters() if p.requires_grad]
        return OptimizerHooks(self.manual_backward, lambda: self._optimizer_step(opt, params, phase), self.device)

    def _optimizer_step(self, opt, params: list[torch.nn.Parameter], phase: str) -> tuple[float, bool]:
        """Test hook, fault injection, then clip / finite check / step (see ``guarded_step``)."""
        if self.pre_step_hook is not None:
            self.pre_step_hook(self, phase)
        if phase == "solver" and self.score_step in set(self.cfg.get("debug", {}).get("nan_grad_steps", []) or []):
            for p in params:  # fault injection (debug.nan_grad_steps): poison this update's gradients
                if p.grad is not None:
                    p.grad.fill_(float("nan"))
        norm, stepped = guarded_step(opt, params, float(self.cfg.optim.grad_clip))
        self.faults.record_update(stepped, phase, self.score_step)
        return norm, stepped

    # ------------------------------------------------------------------ the step
    def rubric_context(self) -> RubricContext:
        return RubricContext(self.evaluator_engine, self.tokenizer, self.retriever, self.harness_state, self.scheduler,
                             int(self.cfg.evaluator.max_prompt_tokens), float(self.cfg.evaluator.temperature))

    def rollout(self, queries: list[str], query_ids: list[str] | None = None) -> StepRollouts:
        """Stages 1-2: evidence, the step's rubrics (from the configured source), K solver rollouts per query."""
        ids = [str(i) for i in (query_ids if query_ids is not None else range(len(queries)))]
        evidence, errors = initial_evidence(self.retriever, queries, int(self.cfg.solver.topk))
        rubrics = self.rubric_source.step_rubrics(self.rubric_context(), queries, ids, evidence)
        solver = solver_rollouts(self.engine, self.tokenizer, self.retriever, queries, rubrics.per_query,
                                 self.harness_state, self.rollout_settings)
        return StepRollouts(list(queries), rubrics, evidence, errors, solver, query_ids=ids)

    def score(self, ro: StepRollouts) -> StepRewards:
        """Stages 2-3: the evaluator scores the K reports of each query; rewards with gates and verifier."""
        answers = parse_answers(ro.solver, self.tokenizer, self.reward_settings)
        reports = [[a.answer if a.answer else None for a in answers[i:i + self.K]] for i in range(0, len(answers), self.K)]
        sources = [[t.retrieved_ids for t in ro.solver[i:i + self.K]] for i in range(0, len(ro.solver), self.K)]
        ro.scoring = scoring_rollouts(self.evaluator_engine, self.tokenizer, self.retriever, ro.queries, reports,
                                      ro.rubrics.per_query, self.harness_state, self.rollout_settings, sources)
        for engine in (self.engine, self.evaluator_engine):  # rollouts done: drop the HF engines' stored KV caches
            getattr(engine, "release_cache", lambda: None)()
        return assemble_rewards(answers, ro.scoring, ro.rubrics.per_query, self.harness_state, self.K,
                                self.reward_settings, self.tokenizer)

    def training_step(self, batch: dict, batch_idx: int) -> None:
        c = self.cfg
        self.data_cursor = int(batch.get("cursor", self.data_cursor + 1))
        sc = StepScalars(self.device)
        t0 = time.perf_counter()
        ro = self.step_rollouts = self.rollout(list(batch["prompt"]), [str(i) for i in batch.get("id", [])] or None)
        t1 = time.perf_counter()
        rw = self.score(ro)
        st = self.step_stage.judge(self.evaluator_engine, self.tokenizer, ro, rw, sc)  # no-op for reward.step=none
        t2 = time.perf_counter()
        record_rewards(sc, ro, rw, self.K, self.reward_settings.verifier_enabled, self.reward_settings.zero)
        record_rollouts(sc, ro)
        metrics: dict[str, float] = dict(ro.rubrics.stats)
        metrics.update(self.rubric_source.observe(self.rubric_context(), ro.queries, ro.query_ids, rw.item_scores,
                                                  self._reports(rw), rw.rewards.view(-1, self.K).tolist()))
        with update_scope(c, self.policy):  # frozen bottom layers run once per input (top_layers.py)
            upd = None
            if not bool(c.solver.freeze):
                upd = solver_update(self.policy, self.ref, ro.solver, rw.rewards, self.grpo_settings,
                                    self.tokenizer.pad_token_id, self._hooks("solver", self.policy),
                                    need_trainer_logprobs=c.rollout.engine == "vllm", step_bonus=st.bonus,
                                    neutral=rw.neutral)
                record_solver_update(sc, upd)  # also rollout/logprob_diff when the update computed trainer log-probs
                metrics.update({"solver/grad_norm": float(np.mean(upd.grad_norms)) if upd.grad_norms else 0.0,
                                "solver/updates": float(upd.updates)})
            # Phase 2: each rubric sample's reward (pooled over ranks), EMA-centred, REINFORCE every U steps
            kind = str(c.evaluator.reward)
            rewards, consistency = sample_rewards(kind, ro, rw, sc, self.K, float(c.evaluator.invalid_rubric_reward),
                                                  self._preference_value(ro) if kind == "preference" else None)
            advantages, r_eval, advantage = centre(rewards, self.baseline)
            trained, advantages = st.fold([s for (s, _), r in zip(ro.rubrics.samples, rewards) if r is not None],
                                          advantages, r_eval is not None and self.rubric_source.trains_evaluator)
            due = (self.score_step + 1) % int(c.evaluator.update_every) == 0
            if trained is not None and bool(c.evaluator.enabled) and due:
                metrics.update(evaluator_update(self.eval_model, self.ref, trained, advantages, self.reinforce_settings,
                                                self.tokenizer.pad_token_id, self._hooks("evaluator", self.eval_model)))
        t3 = time.perf_counter()
        self.scheduler.update_stats(ro.rubrics.first.dims, [consistency] if math.isfinite(consistency) else [])
        for sch in self._schedulers():
            sch.step()
        for tag, value in (("time/rollout_s", t1 - t0), ("time/scoring_s", t2 - t1), ("time/update_s", t3 - t2)):
            sc.max(tag, value)
        metrics["rollout/retrieval_errors_step"] = self.faults.record_step(ro)
        metrics.update(sc.compute())
        metrics.update(global_values(ro, r_eval, advantage, self))
        metrics["throughput/tokens_per_s"] = throughput(metrics)
        report_distributions(self.trainer, ro, rw, upd, self.score_step)
        self.last_step = {"rollouts": ro, "rewards": rw, "solver": upd, "evaluator_reward": r_eval,
                          "evaluator_advantage": advantage, "sample_rewards": rewards, "metrics": metrics}
        self.stats_window.append(metrics)
        self.score_step += 1
        self._advance_global_step()
        self._log_metrics(metrics)
        reason = self.faults.halt_reason()
        if reason is not None:
            self._halt(metrics, reason)
        log.info("SCORE step %d done: reward=%.3f valid=%.2f rubric_valid=%d consistency=%.3f tool_calls=%.2f (%.1fs)",
                 self.score_step - 1, metrics["solver/reward_mean"], metrics["solver/answer_valid_rate"],
                 int(ro.rubrics.valid), consistency, metrics["rollout/tool_calls_mean"], time.perf_counter() - t0)
        every = int(c.logging.text_every_n_steps)
        if every > 0 and (every == 1 or self.score_step % every == 1):
            report_texts(self.trainer, step_samples(ro, rw, self.harness_state, self.tokenizer), self.score_step - 1,
                         str(c.paths.output_dir))

    def _reports(self, rw: StepRewards) -> list[list[str | None]]:
        return [[a.answer for a in rw.answers[i:i + self.K]] for i in range(0, len(rw.answers), self.K)]

    def _preference_value(self, ro: StepRollouts):
        """A thunk: the step's preference agreement for the step rubric (collective when called)."""
        def score_pairs(prompts, groups):
            rubric = ro.rubrics.first
            trajs = scoring_rollouts(self.evaluator_engine, self.tokenizer, self.retriever, prompts, groups,
                                     [rubric] * len(prompts), self.harness_state, self.rollout_settings)
            evals = group_evaluations(trajs, [rubric] * len(prompts), 2, self.rollout_settings.scoring_protocol,
                                      self.harness_state.process_constraints, self.tokenizer)
            return [g.parse.score_matrix(rubric, 2) for g in evals]

        return lambda: self.preference.reward(self.score_step, ro.rubrics.first, score_pairs, self.evaluator_engine)

    def _schedulers(self) -> list:
        s = self.lr_schedulers()
        if s is None:
            return []
        return list(s) if isinstance(s, (list, tuple)) else [s]

    def _advance_global_step(self) -> None:
        """Make Lightning's ``global_step`` count SCORE steps.

        Under manual optimisation ``global_step`` is the number of ``LightningOptimizer.step`` calls;
        a SCORE step makes zero (frozen solver, skipped update) to many (PPO mini-batches, evaluator)
        raw optimiser calls, so the progress counter is advanced here exactly once per step.
        """
        progress = self.trainer.fit_loop.epoch_loop.manual_optimization.optim_step_progress
        progress.increment_ready()
        progress.increment_completed()

    # ------------------------------------------------------------------ faults
    def _halt(self, metrics: dict[str, float], reason: str) -> None:
        """Write ``last.ckpt`` for the finished step (atomic) and stop with :class:`TrainingHalted`."""
        if self.logger is not None and self.global_rank == 0:
            # self.log() would only flush after training_step returns, which it will not
            self.logger.log_metrics(_finite(metrics), step=self.score_step - 1)
            self.logger.save()
        path = Path(self.cfg.callbacks.model_checkpoint.dirpath) / "last.ckpt"
        self.trainer.save_checkpoint(str(path))
        log.error("training stopped: %s; checkpoint saved to %s", reason, path)
        raise TrainingHalted(f"training stopped: {reason}; checkpoint saved to {path}")

    # ------------------------------------------------------------------ logging
    def _log_metrics(self, metrics: dict[str, float]) -> None:
        # Every value is already reduced over ranks (StepScalars) or identical on all of them, so no
        # sync_dist here; logger=True uses global_step, which equals score_step (_advance_global_step).
        clean = _finite(metrics)
        self.log_dict(clean, on_step=True, on_epoch=False, prog_bar=False, logger=True, batch_size=1, sync_dist=False)
        self.log("score_step", float(self.score_step), prog_bar=True, logger=False, batch_size=1)
        self.log("reward", clean.get("solver/reward_mean", 0.0), prog_bar=True, logger=False, batch_size=1)

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["score"] = {
            "score_step": self.score_step, "data_cursor": self.data_cursor, "baseline": self.baseline.state_dict(),
            "scheduler": self.scheduler.state_dict(), "harness_state": self.harness_state.to_dict(),
            **self.faults.state_dict(), **self.step_stage.state_dict(), "recent": self.stats_window.state(),
            "rng": rng_state(),
            # every rank's RNG (dump_checkpoint runs on all ranks; rank 0 writes the file)
            "rng_per_rank": D.gather_objects(rng_state()),
            # per-query rubric buffers live on the rank that saw the query: keep every rank's
            "rubric_source": D.gather_objects(self.rubric_source.state_dict()),
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        s = checkpoint.get("score")
        if s is None:
            raise ValueError("checkpoint has no 'score' section: not a score-lightning checkpoint")
        self.score_step, self.data_cursor = int(s["score_step"]), int(s["data_cursor"])
        self.baseline.load_state_dict(s["baseline"])
        self.harness_state = HarnessState.from_dict(s["harness_state"])
        self.scheduler.load_state_dict(s["scheduler"])
        self.faults.load_state_dict(s)
        self.step_stage.load_state_dict(s)
        self.stats_window.load(s.get("recent", []))
        merged: dict = {}
        for part in s.get("rubric_source") or []:
            merged.update(part)
        self.rubric_source.load_state_dict(merged)
        per_rank = s.get("rng_per_rank") or [s["rng"]]
        self._pending_rng = per_rank[self.global_rank] if self.global_rank < len(per_rank) else s["rng"]
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if dm is not None and hasattr(dm, "set_start_cursor"):
            dm.set_start_cursor(self.data_cursor)

    def on_train_start(self) -> None:
        if self.trainer.is_global_zero:
            add_score_layout(self.trainer.loggers)  # TensorBoard's "SCORE" custom-scalars page
        # RNG is restored last, after setup consumed whatever it needed, so sampling resumes exactly.
        if self._pending_rng is not None:
            set_rng_state(self._pending_rng)
            self._pending_rng = None
        elif self.global_rank > 0:
            seed_rank(int(self.cfg.seed), self.global_rank)

    # ------------------------------------------------------------------ export
    def export_policy(self, out_dir: str | Path) -> Path:
        """``save_pretrained`` of the policy (LoRA merged, adapter in ``adapter/``) plus tokenizer; collective under FSDP."""
        from score_lightning.export import save_policy

        out = Path(out_dir)
        save_policy(self.policy, out, write=self.global_rank == 0)
        if self.global_rank == 0:
            self.tokenizer.save_pretrained(out)
            # the run's resolved config beside the weights: evaluation takes the solver budgets from it
            (out / "run_config.json").write_text(json.dumps(OmegaConf.to_container(self.cfg, resolve=True), indent=1))
        return out


def _finite(metrics: dict[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
