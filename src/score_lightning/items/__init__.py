"""Evidence-backed rubric items (DeepRubric): evidence trees and the item builder ``scripts/build_rubrics.py`` runs.

The items file format is :mod:`score_lightning.data.items`; :mod:`score_lightning.rewards.items` is the verifier
that decides an item for a report.
"""
