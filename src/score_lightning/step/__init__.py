"""The stages of one SCORE step, each a plain function or small class testable without Lightning.

In the order ``ScoreModule.training_step`` calls them (Algorithm 1 of the paper):

1. :mod:`~score_lightning.step.rubric_stage` - the evaluator samples one rubric (H_t, w_t) for the
   step (rank 0 samples, every rank receives it with its token ids);
2. :mod:`~score_lightning.step.rollouts` - initial evidence D_q^0, K solver rollouts per query,
   then the evaluator's scoring rollouts (which may search to verify);
3. :mod:`~score_lightning.step.reward_assembly` - validity, scores, process-constraint gates and
   the reward verifier into the solver rewards s_i^k; then the evaluator objectives' judgements
   (:mod:`~score_lightning.step.objectives`: ``reward.step``'s credit, ``evaluator.scoring_reward``);
4. :mod:`~score_lightning.step.solver_update` - Phase 1, GRPO on the shared actor, over the rows of
   :mod:`~score_lightning.step.solver_rows` (a MaMs trajectory trains one row per role call);
5. :mod:`~score_lightning.step.evaluator_reward` and :mod:`~score_lightning.step.evaluator_update`
   - the consistency reward, its EMA-centred advantage and Phase 2, REINFORCE on the rubric tokens;
6. :mod:`~score_lightning.step.scalars` - everything logged, reduced across data-parallel ranks.

The update maths the stages share sits beside them: :mod:`~score_lightning.step.losses` (GRPO and
REINFORCE as pure tensor functions), :mod:`~score_lightning.step.rollout_correction` (engine-trainer
importance weights, ``optim.rollout_correction``), :mod:`~score_lightning.step.batching` (PPO mini/micro
batches with an exact global token mean) and :mod:`~score_lightning.step.optimizers` (both roles' AdamW).

Stages 1-3 (and dynamic sampling's draws) are one unit, :mod:`~score_lightning.generation.generator`, which the
trainer runs under ``rollout.mode=sync`` and the rollout worker (:mod:`score_lightning.generation.async_worker`)
under ``async``; :mod:`~score_lightning.generation.prefetch` is the trainer's side of that, and
:mod:`~score_lightning.generation.batch_codec` stores the batch in flight in a checkpoint.
"""
