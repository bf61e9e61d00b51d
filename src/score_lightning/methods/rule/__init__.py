"""The rule reward (``reward.source=rule``): the known-good control arm, R = a(r)(1 + q(r)), with no evaluator.

``scoring.py`` registers the source (``plugin.py`` imports it); q(r) itself is the core's
(:mod:`score_lightning.step.report_quality`), since the evaluator's scores are measured against it too.
"""
