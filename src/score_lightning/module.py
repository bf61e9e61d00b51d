"""``ScoreModule``: one SCORE step per ``training_step``, as Lightning glue around the step stages.

Step t (Algorithm 1; each stage lives in :mod:`score_lightning.step`): initial evidence -> one
rubric for the global batch -> K solver rollouts per query -> scoring -> rewards (gates, verifier)
-> Phase 1 solver GRPO -> evaluator reward + EMA -> Phase 2 evaluator REINFORCE (every U) ->
scheduler statistics -> logging. ``score_step`` counts SCORE steps, and Lightning's ``global_step``
is kept equal to it (``glue.run_state.RunStateHooks.advance_global_step``), so ``trainer.max_steps``, checkpoint
intervals, the harness period and the TensorBoard x-axis all count SCORE steps.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Callable

import numpy as np
from lightning.pytorch import LightningModule
from omegaconf import DictConfig, OmegaConf

from score_lightning.glue.building import BuildingHooks
from score_lightning.glue.outputs import OutputHooks
from score_lightning.methods.preference.hooks import PreferenceHooks
from score_lightning.glue.run_state import RunStateHooks
from score_lightning.harness.scheduler import DimensionScheduler
from score_lightning.harness.state import HarnessState
from score_lightning.harness.stats_window import StatsWindow
from score_lightning.rewards.functions import EMABaseline
from score_lightning.step.evaluator_phase import centre, sample_rewards
from score_lightning.step.evaluator_update import ReinforceSettings, evaluator_update
from score_lightning.rollout.modes import asynchronous, stale_rollouts
from score_lightning.step.citation_reward import observed_passages
from score_lightning.step.dynamic_sampling import EXTRA_STREAM_SEED, DynamicSampling
from score_lightning.step.faults import FaultMonitor
from score_lightning.step.record import record_ranking, record_rewards, record_rollouts, record_solver_update
from score_lightning.step.report import global_values, report_distributions, report_texts, throughput
from score_lightning.generation.generator import GenerationHooks, stamp_policy_version
from score_lightning.step.judge_scoring import check_judgements, uses_judge
from score_lightning.step.judged_rows import judged_view
from score_lightning.generation.prefetch import RolloutPrefetcher, record_async
from score_lightning.step.reward_assembly import RewardSettings, StepRewards
from score_lightning.step.rollouts import RolloutSettings
from score_lightning.step.samples import step_samples
from score_lightning.step.scalars import StepScalars
from score_lightning.step.scoring_reward import ScoringRewardStage
from score_lightning.step.solver_update import GRPOSettings, solver_update
from score_lightning.methods.rubricem.credit import step_stage_from_cfg
from score_lightning.step.types import StepRollouts
from score_lightning.policy.top_layers import update_scope

log = logging.getLogger(__name__)

class ScoreModule(BuildingHooks, RunStateHooks, OutputHooks, GenerationHooks, PreferenceHooks, LightningModule):
    """The SCORE trainer. ``cfg`` is the full Hydra config (validated before construction).

    This file is the step; building models, engines and optimisers, the checkpointed run state, and
    logging / halting / export are the hooks of :mod:`score_lightning.glue`; the generating stages
    (rubric, rollouts, scoring, dynamic sampling) are :class:`~score_lightning.generation.generator.GenerationHooks`,
    which the asynchronous rollout worker runs too.
    """

    def __init__(self, cfg: DictConfig | dict, model_path: str, tokenizer_path: str | None = None):
        super().__init__()
        self.automatic_optimization = False
        cfg = OmegaConf.create(cfg) if isinstance(cfg, dict) else cfg
        self.save_hyperparameters({"cfg": OmegaConf.to_container(cfg, resolve=True), "model_path": model_path,
                                   "tokenizer_path": tokenizer_path or model_path})
        self.cfg, self.model_path = cfg, model_path
        from score_lightning.policy.models import load_tokenizer

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
        self.step_stage = step_stage_from_cfg(cfg)  # reward.step=rubric: ARCO's step judgements; stage: RubricEM's
        self.scoring_stage = ScoringRewardStage.from_cfg(cfg)  # evaluator.scoring_reward: the scoring tokens train
        self.sampling = DynamicSampling.from_cfg(cfg)  # solver.dynamic_sampling: DAPO's draws until B groups teach
        #: rollout.mode=async: the worker that generates the next step's batch during this step's update
        self.prefetch = RolloutPrefetcher(cfg, model_path, tokenizer_path or model_path) if asynchronous(cfg) else None
        #: pi_old is recomputed to log the engine-trainer gap: vLLM's kernels, or an HF worker's older weights
        self.engine_gap_logged = cfg.rollout.engine == "vllm" or (stale_rollouts(cfg) and cfg.rollout.engine == "hf")
        self.policy = self.evaluator_policy = self.ref = None
        self.engine = self.evaluator_engine = None  # set in setup() (HF, scripted) or by the vLLM callback
        self.retriever = None
        #: test hook: called with (module, phase) before each optimiser step; may poison gradients
        self.pre_step_hook: Callable[["ScoreModule", str], None] | None = None
        #: the current step's rollouts (for ``pre_step_hook``), and the last step's rollouts, rewards
        #: and evaluator signal (tests and drills read them)
        self.step_rollouts: StepRollouts | None = None
        self.last_step: dict | None = None

    # ------------------------------------------------------------------ the step
    def training_step(self, batch: dict, batch_idx: int) -> None:
        c = self.cfg
        self.data_cursor = int(batch.get("cursor", self.data_cursor + 1))
        sc = StepScalars(self.device)
        t0 = time.perf_counter()
        if self.prefetch is None:  # rollout.mode=sync: the step generates its own batch, now
            ro = self.step_rollouts = self.rollout(list(batch["prompt"]), [str(i) for i in batch.get("id", [])] or None)
            t1 = time.perf_counter()
            rw = self.score(ro)
            ro, rw, drawn = self.draw_until_informative(ro, rw)  # solver.dynamic_sampling (a no-op when off)
            stamp_policy_version(ro, self.score_step)
            gen = None
        else:  # rollout.mode=async: the worker's batch (generation/prefetch.py); it starts on the next one before the update
            gen = self.prefetch.step_batch(self, batch)
            ro, rw, drawn = gen.rollouts, gen.rewards, gen.drawn
            record_async(sc, gen, self.score_step, self.prefetch.discarded)
            self.last_weight_sync_s = self.prefetch.weight_sync_s
            t1 = time.perf_counter()
        self.step_rollouts = ro
        judged = check_judgements(rw.judge, float(c.judge.max_failed_rate), c.callbacks.model_checkpoint.dirpath) \
            if uses_judge(c) else {}  # too many failed judgements stop the run here, before any update
        st = self.step_stage.judge(self.evaluator_engine, self.tokenizer, ro, rw, sc)  # no-op for reward.step=none
        sj = self.scoring_stage.judge(ro, rw, self.K, sc)  # no-op for evaluator.scoring_reward=none
        t2 = time.perf_counter()
        record_rewards(sc, ro, rw, self.K, self.reward_settings.verifier_enabled, self.reward_settings.zero)
        record_rollouts(sc, ro)
        record_ranking(sc, ro, rw, self.K, self.reward_settings.rule_quality, self.reward_settings.items_path)
        sc.mean("solver/zero_variance_group_rate", drawn[0], drawn[1])
        sc.max("solver/sampling_draws", drawn[2])
        metrics: dict[str, float] = dict(ro.rubrics.stats) | judged
        # the rubric source learns from judged reports only: an unjudged one's row of zeros is no score
        seen = judged_view(rw.scored.tolist(), self.K, rw.item_scores, self._reports(rw),
                           rw.rewards.view(-1, self.K).tolist(), lambda: self._passages(ro))
        metrics.update(self.rubric_source.observe(self.rubric_context(), ro.queries, ro.query_ids, seen[0], seen[1],
                                                  seen[2], passages=seen[3]))
        upd = None
        if not bool(c.solver.freeze):
            with update_scope(c, self.policy):  # frozen bottom layers run once per input; freed after this update
                upd = solver_update(self.policy, self.ref, ro.solver, rw.rewards, self.grpo_settings,
                                    self.tokenizer.pad_token_id, self.optimizer_hooks("solver", self.policy),
                                    need_trainer_logprobs=self.engine_gap_logged, step_bonus=st.bonus,
                                    neutral=rw.neutral, exclude=rw.excluded)
            # also the engine-trainer gap (rollout/logprob_diff, mismatch_kl, is_*) when it computed pi_old
            record_solver_update(sc, upd, self.grpo_settings.correction)
            metrics.update({"solver/grad_norm": float(np.mean(upd.grad_norms)) if upd.grad_norms else 0.0,
                            "solver/updates": float(upd.updates)})
        # Phase 2: each rubric sample's reward (pooled over ranks), EMA-centred, REINFORCE every U steps
        kind = str(c.evaluator.reward)
        groups = self.preference_rubric_groups() if kind == "preference" and self.preference.group_size > 1 else None
        value = (lambda: groups.agreement) if groups is not None else self.preference_value(ro) \
            if kind == "preference" else None
        rewards, consistency = sample_rewards(kind, ro, rw, sc, self.K, float(c.evaluator.invalid_rubric_reward), value)
        advantages, r_eval, advantage = centre(rewards, self.baseline)
        if kind == "preference" and self.preference.appraisal_weight > 0:
            metrics["evaluator/appraisal_failures"] = float(self.preference.appraisal_failures)  # cumulative
        if kind == "preference":  # pair evaluations that did not finish: left out of the reward, counted
            metrics["evaluator/preference_incomplete_rate"] = self.preference.incomplete_rate
        trained, advantages = st.fold([s for (s, _), r in zip(ro.rubrics.samples, rewards) if r is not None], advantages,
                                      r_eval is not None and self.rubric_source.trains_evaluator and groups is None)
        trained, advantages = sj.fold(trained, advantages)
        if groups is not None:  # GRPO over each pair's rubrics trains the writer; the step's rubric only logs
            trained, advantages = groups.fold(trained, advantages)
        due = (self.score_step + 1) % int(c.evaluator.update_every) == 0
        if trained is not None and bool(c.evaluator.enabled) and due:
            with update_scope(c, self.eval_model):  # the evaluator's own replays, freed after its update
                metrics.update(evaluator_update(self.eval_model, self.ref, trained, advantages, self.reinforce_settings,
                                                self.tokenizer.pad_token_id, self.optimizer_hooks("evaluator", self.eval_model)))
        t3 = time.perf_counter()
        self.scheduler.update_stats(ro.rubrics.first.dims, [consistency] if math.isfinite(consistency) else [])
        for sch in self.lr_scheduler_list():
            sch.step()
        times = (t1 - t0, t2 - t1) if gen is None else (gen.rollout_s, gen.scoring_s + t2 - t1)  # async: the worker's
        for tag, value in (("time/rollout_s", times[0]), ("time/scoring_s", times[1]), ("time/update_s", t3 - t2)):
            sc.max(tag, value)
        metrics["rollout/retrieval_errors_step"] = self.faults.record_step(ro)
        metrics.update(sc.compute())
        metrics.update(global_values(ro, r_eval, advantage, self))
        metrics["throughput/tokens_per_s"] = throughput(metrics)
        report_distributions(self.trainer, ro, rw, upd, self.score_step)
        self.last_step = {"rollouts": ro, "rewards": rw, "solver": upd, "evaluator_reward": r_eval,
                          "evaluator_advantage": advantage, "sample_rewards": rewards, "scoring": sj,
                          "metrics": metrics}
        self.stats_window.append(metrics)
        self.score_step += 1
        self.advance_global_step()
        self.log_step_metrics(metrics)
        reason = self.faults.halt_reason()
        if reason is not None:
            self.halt(metrics, reason)
        log.info("SCORE step %d done: reward=%.3f valid=%.2f rubric_valid=%d consistency=%.3f tool_calls=%.2f (%.1fs)",
                 self.score_step - 1, metrics["solver/reward_mean"], metrics["solver/answer_valid_rate"],
                 int(ro.rubrics.valid), consistency, metrics["rollout/tool_calls_mean"], time.perf_counter() - t0)
        every = int(c.logging.text_every_n_steps)
        if every > 0 and (every == 1 or self.score_step % every == 1):
            report_texts(self.trainer, step_samples(ro, rw, self.harness_state, self.tokenizer), self.score_step - 1,
                         str(c.paths.output_dir))

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
        shown = [observed_passages(t, self.tokenizer) for t in ro.solver]
        return [shown[i:i + self.K] for i in range(0, len(shown), self.K)]

    def _reports(self, rw: StepRewards) -> list[list[str | None]]:
        return [[a.answer for a in rw.answers[i:i + self.K]] for i in range(0, len(rw.answers), self.K)]
