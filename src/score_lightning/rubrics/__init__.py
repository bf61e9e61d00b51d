"""Where the solver's rubric comes from (the ``rubric`` config group), behind one small interface.

* ``score`` (SCORE, here): the evaluator samples dimensions and weights from the harness pool, one rubric
  for the step, trained by REINFORCE on the evaluator reward;
* ``evolving`` (RLER, DR Tulu; ``methods/rler/``): a per-query buffer of natural-language items, written by
  the evaluator after searching, grown from contrasting rollouts and pruned by score spread;
* ``given`` (``methods/given/``): fixed per-query rubrics from a file (DeepResearch Bench criteria, binary
  checklists).

Only SCORE's own source lives here: the relatives' sources are plug-ins under ``methods/``, chosen by the
group's ``_target_``.

``ScoreModule`` calls :class:`~score_lightning.step.rubric_source.RubricSource` methods and never branches
on the method's name, so every mode shares the rollout, scoring, verifier, harness and GRPO code and
the same TensorBoard tags.
"""
