"""Where the solver's rubric comes from (the ``rubric`` config group), behind one small interface.

* ``score`` (SCORE): the evaluator samples dimensions and weights from the harness pool, one rubric
  for the step, trained by REINFORCE on the evaluator reward;
* ``evolving`` (RLER, DR Tulu): a per-query buffer of natural-language items, written by the
  evaluator after searching, grown from contrasting rollouts and pruned by score spread;
* ``given``: fixed per-query rubrics from a file (DeepResearch Bench criteria, binary checklists).

``ScoreModule`` calls :class:`~score_lightning.step.rubric_source.RubricSource` methods and never branches
on the method's name, so every mode shares the rollout, scoring, verifier, harness and GRPO code and
the same TensorBoard tags.
"""
