"""Evidence-backed rubric items (DeepRubric): evidence trees and the item builder ``scripts/build_rubrics.py`` runs.

A tool around training, as the rest of ``evaluation/``: the items are the ground truth the report card's
``item_recall``, the evaluator pair sets' quality order and ``reward.rule_quality=item_recall`` read. Their file
format is :mod:`score_lightning.data.items`; :mod:`score_lightning.rewards.items` is the verifier that decides an
item for a report.
"""
