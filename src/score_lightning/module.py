"""``ScoreModule``: one SCORE step per ``training_step``, as Lightning glue around the step stages.

Step t (Algorithm 1; each stage lives in :mod:`score_lightning.step`): initial evidence -> one
rubric for the global batch -> K solver rollouts per query -> scoring -> rewards (gates, verifier)
-> the objectives' judgements -> Phase 1 solver GRPO -> evaluator reward + EMA -> the objectives folded ->
Phase 2 evaluator REINFORCE (every U) -> scheduler statistics -> logging. ``score_step`` counts SCORE steps, and
Lightning's ``global_step`` is kept equal to it (``glue.run_state.RunStateHooks.advance_global_step``), so
``trainer.max_steps``, checkpoint intervals, the harness period and the TensorBoard x-axis all count SCORE steps.
The step names no method: ``evaluator.reward`` and ``reward.step`` select registered plug-ins
(:mod:`score_lightning.step.objectives`), ``solver.objective`` Phase 1's (:mod:`score_lightning.step.solver_objective`).
"""

from __future__ import annotations

import math
from typing import Callable

from lightning.pytorch import LightningModule
from omegaconf import DictConfig, OmegaConf

from score_lightning.glue.building import BuildingHooks
from score_lightning.glue.outputs import OutputHooks
from score_lightning.glue.run_state import RunStateHooks
from score_lightning.harness.scheduler import DimensionScheduler
from score_lightning.harness.state import HarnessState
from score_lightning.harness.stats_window import StatsWindow
from score_lightning.rewards.functions import EMABaseline
from score_lightning.step.evaluator_objective import StepView, merged_bonuses
from score_lightning.step.evaluator_phase import EvaluatorSignal, centre, sample_rewards
from score_lightning.step.evaluator_update import evaluator_update, reinforce_settings
from score_lightning.step.objectives import (
    EVALUATOR_REWARDS, build_objectives, fold_objectives, measured_value, trains_step_rubric,
)
from score_lightning.rollout.modes import asynchronous, stale_rollouts
from score_lightning.rollout.search_steps import shown_passages
from score_lightning.step.dynamic_sampling import EXTRA_STREAM_SEED
from score_lightning.step.faults import FaultMonitor, check_judgements
from score_lightning.step.record import record_step
from score_lightning.step.report import StepClock, StepOutcome
from score_lightning.generation.generator import GeneratorHost, RunAccess, build_generator, stamp_policy_version
from score_lightning.step.judged_rows import judged_view
from score_lightning.generation.prefetch import RolloutPrefetcher, record_async
from score_lightning.step.reward_assembly import StepRewards
from score_lightning.step.rollout_correction import rollout_correction
from score_lightning.step.scalars import StepScalars
from score_lightning.step.solver_objective import SOLVER_OBJECTIVES, SolverInputs
from score_lightning.step.types import StepRollouts
from score_lightning.policy.top_layers import update_scope


class ScoreModule(BuildingHooks, RunStateHooks, OutputHooks, GeneratorHost, LightningModule):
    """The SCORE trainer. ``cfg`` is the full Hydra config (validated before construction).

    This file is the step; building models, engines and optimisers, the checkpointed run state, and
    logging / halting / export are the hooks of :mod:`score_lightning.glue`; the generating stages
    (rubric, rollouts, scoring, dynamic sampling) are ``self.generator``
    (:class:`~score_lightning.generation.generator.Generator`, built as the asynchronous rollout worker builds its
    own); its tokenizer, engines, retriever, rubric source and settings are read and set through the module.
    """

    def __init__(self, cfg: DictConfig | dict, model_path: str, tokenizer_path: str | None = None):
        super().__init__()
        self.automatic_optimization = False
        cfg = OmegaConf.create(cfg) if isinstance(cfg, dict) else cfg
        self.save_hyperparameters({"cfg": OmegaConf.to_container(cfg, resolve=True), "model_path": model_path,
                                   "tokenizer_path": tokenizer_path or model_path})
        self.cfg, self.model_path = cfg, model_path
        #: rubric, rollouts, scoring, dynamic sampling; what it reads of the run, it reads from this module
        self.generator = build_generator(cfg, tokenizer_path or model_path, RunAccess(
            lambda: self.harness_state, lambda: self.scheduler, lambda: self.score_step, lambda: self._extra_stream(),
            lambda: getattr(getattr(self, "step_stage", None), "guidance", None)))  # RubricEM's reflection memory
        self.K = int(cfg.solver.num_rollouts)
        self.score_step = self.data_cursor = 0
        self._harness_state = HarnessState.from_dict(OmegaConf.to_container(cfg.harness.initial_state, resolve=True))
        scheduler_cfg = OmegaConf.to_container(cfg.harness.scheduler, resolve=True)
        self.scheduler = DimensionScheduler(list(self._harness_state.dimension_pool), **scheduler_cfg)
        self.baseline = EMABaseline(float(cfg.evaluator.ema_beta))
        self.faults = FaultMonitor(int(cfg.optim.max_consecutive_skips), int(cfg.retriever.max_failed_steps),
                                   str(cfg.retriever.url or "the retriever"))
        self.stats_window = StatsWindow(int(cfg.harness.every_n_steps))
        self._pending_rng: dict | None = None
        #: solver.objective: how Phase 1 trains the solver (a registered SolverObjective; grpo by default)
        self.solver_objective = SOLVER_OBJECTIVES.get(str(cfg.solver.objective)).build(cfg)
        self.reinforce_settings = reinforce_settings(cfg.evaluator, cfg.loss, cfg.actor,
                                                     rollout_correction(cfg.optim, cfg.loss, cfg.rollout))
        #: evaluator.reward: what each rubric sample earns (a registered EvaluatorReward)
        self.evaluator_reward = EVALUATOR_REWARDS.get(str(cfg.evaluator.reward))
        #: the evaluator's other objectives, in order: reward.step's credit, evaluator.scoring_reward, and
        #: evaluator.reward's own (preference pairs); ``step_stage`` and ``scoring_stage`` name the first two
        self.objectives = build_objectives(cfg, self.evaluator_reward)
        self.step_stage, self.scoring_stage = self.objectives[:2]
        #: rollout.mode=async: the worker that generates the next step's batch during this step's update
        self.prefetch = (RolloutPrefetcher(cfg, model_path, tokenizer_path or model_path)
                         if asynchronous(cfg.rollout) else None)
        #: pi_old is recomputed to log the engine-trainer gap: vLLM's kernels, or an HF worker's older weights
        self.engine_gap_logged = cfg.rollout.engine == "vllm" or (stale_rollouts(cfg.rollout)
                                                                  and cfg.rollout.engine == "hf")
        self.policy = self.evaluator_policy = self.ref = None
        #: test hook: called with (module, phase) before each optimiser step; may poison gradients
        self.pre_step_hook: Callable[["ScoreModule", str], None] | None = None
        #: the current step's rollouts (for ``pre_step_hook``), and the last step's rollouts, rewards
        #: and evaluator signal (tests and drills read them)
        self.step_rollouts: StepRollouts | None = None
        self.last_step: dict | None = None

    # ------------------------------------------------------------------ the step
    def training_step(self, batch: dict, batch_idx: int) -> None:
        """One SCORE step, Algorithm 1: generate and score, judge, record, Phase 1, Phase 2, log."""
        cfg = self.cfg
        self.data_cursor = int(batch.get("cursor", self.data_cursor + 1))
        scalars, clock = StepScalars(self.device), StepClock()
        rollouts, rewards, drawn = self.generate_batch(batch, scalars, clock)  # lines 1-6: rubric, K rollouts, scoring
        # too many failed judgements stop the run here, before any update
        judged = (check_judgements(rewards.judge, float(cfg.judge.max_failed_rate),
                                   cfg.callbacks.model_checkpoint.dirpath)
                  if self.generator.calls_judge else {})
        view = StepView(self, rollouts, rewards, scalars, self.K, self.score_step)
        bonus = merged_bonuses([objective.judge(view) for objective in self.objectives])  # step credit, scoring reward
        clock.lap("scoring")
        record_step(scalars, rollouts, rewards, drawn, cfg.reward, cfg.verifier, self.K)
        metrics = dict(rollouts.rubrics.stats) | judged | self.observe_rubrics(rollouts, rewards)
        solver = None
        if not bool(cfg.solver.freeze):  # Phase 1: solver.objective (GRPO by default) on the solver
            # frozen bottom layers run once per input; freed after this update
            with update_scope(cfg.model, cfg.optim, self.policy):
                solver = self.solver_objective.update(SolverInputs(
                    self.policy, self.ref, rollouts.solver, rewards.rewards, rewards.scored, rewards.neutral,
                    rewards.excluded, bonus, self.tokenizer.pad_token_id, self.optimizer_hooks("solver", self.policy),
                    need_trainer_logprobs=self.engine_gap_logged))
            metrics.update(self.solver_objective.record(scalars, solver))
        # Phase 2: each rubric sample's reward (pooled over ranks), EMA-centred, the objectives folded in, REINFORCE
        # every U steps
        measured = measured_value([objective.measure(view) for objective in self.objectives])
        signal = EvaluatorSignal()
        signal.rewards, signal.consistency = sample_rewards(self.evaluator_reward, rollouts, rewards, scalars, self.K,
                                                            float(cfg.evaluator.invalid_rubric_reward), measured)
        signal.advantages, signal.mean_reward, signal.mean_advantage = centre(signal.rewards, self.baseline)
        rubric_trains = signal.mean_reward is not None and self.rubric_source.trains_evaluator \
            and trains_step_rubric(self.objectives)
        rubric_rows = [sample for (sample, _), reward in zip(rollouts.rubrics.samples, signal.rewards)
                       if reward is not None]
        trained, advantages = fold_objectives(self.objectives, rubric_rows if rubric_trains else None,
                                              signal.advantages)
        due = (self.score_step + 1) % int(cfg.evaluator.update_every) == 0
        if trained is not None and bool(cfg.evaluator.enabled) and due:
            # the evaluator's own replays, freed after its update
            with update_scope(cfg.model, cfg.optim, self.eval_model):
                hooks = self.optimizer_hooks("evaluator", self.eval_model)
                metrics.update(evaluator_update(self.eval_model, self.ref, trained, advantages, self.reinforce_settings,
                                                self.tokenizer.pad_token_id, hooks))
        clock.lap("update")
        for objective in self.objectives:
            metrics.update(objective.scalars())
        self.scheduler.update_stats(rollouts.rubrics.first.dims,
                                    [signal.consistency] if math.isfinite(signal.consistency) else [])
        for lr_scheduler in self.lr_scheduler_list():
            lr_scheduler.step()
        outcome = StepOutcome(rollouts, rewards, solver, signal, self.scoring_stage.judgement, scalars, metrics, clock)
        metrics = self.step_metrics(outcome)  # pooled over ranks (collective); kept in last_step
        self.score_step += 1
        self.advance_global_step()
        self.log_step(outcome, metrics)

    def generate_batch(self, batch: dict, scalars: StepScalars, clock: StepClock
                       ) -> tuple[StepRollouts, StepRewards, tuple]:
        """The step's rollouts and rewards: generated now (``rollout.mode=sync``), or the worker's batch (``async``,
        generation/prefetch.py: it starts on the next one before the update). Also dynamic sampling's draws."""
        if self.prefetch is None:
            ids = [str(i) for i in batch.get("id", [])] or None  # data, not config
            rollouts = self.step_rollouts = self.rollout(list(batch["prompt"]), ids)
            clock.lap("rollout")
            rewards = self.score(rollouts)
            rollouts, rewards, drawn = self.draw_until_informative(rollouts, rewards)  # a no-op when off
            stamp_policy_version(rollouts, self.score_step)
        else:
            generated = self.prefetch.step_batch(self, batch)
            rollouts, rewards, drawn = generated.rollouts, generated.rewards, generated.drawn
            record_async(scalars, generated, self.score_step, self.prefetch.discarded)
            self.last_weight_sync_s = self.prefetch.weight_sync_s
            clock.add("rollout", generated.rollout_s)
            clock.add("scoring", generated.scoring_s)
            clock.lap(None)
        self.step_rollouts = rollouts
        return rollouts, rewards, drawn

    def observe_rubrics(self, rollouts: StepRollouts, rewards: StepRewards) -> dict[str, float]:
        """The rubric source learns from the judged reports only: an unjudged one's row of zeros is no score."""
        seen = judged_view(rewards.scored.tolist(), self.K, rewards.item_scores, self._reports(rewards),
                           rewards.rewards.view(-1, self.K).tolist(), lambda: self._passages(rollouts))
        return self.rubric_source.observe(self.rubric_context(), rollouts.queries, rollouts.query_ids, seen[0],
                                          seen[1], seen[2], passages=seen[3])

    def _extra_stream(self):
        """The extra draws' own query stream (training queries in another order; see ``extra_batch``)."""
        if getattr(self, "_extra", None) is None:
            from score_lightning.data.datamodule import QueryStream

            dm = self.trainer.datamodule
            self._extra = QueryStream(dm.queries, dm.batch_size, int(self.cfg.seed) + EXTRA_STREAM_SEED, 0,
                                      self.global_rank, self.trainer.world_size)
        return self._extra

    def _passages(self, ro: StepRollouts) -> list[list[dict[str, str]]]:
        """Per query, per report: what its searches showed it, by id (the evolving rubric's contrast reads it)."""
        shown = [shown_passages(t, self.tokenizer) for t in ro.solver]
        return [shown[i:i + self.K] for i in range(0, len(shown), self.K)]

    def _reports(self, rw: StepRewards) -> list[list[str | None]]:
        return [[a.answer for a in rw.answers[i:i + self.K]] for i in range(0, len(rw.answers), self.K)]
