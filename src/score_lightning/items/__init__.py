"""Evidence-backed rubric items (DeepRubric): the items file format, evidence trees and the item builder.

``scripts/build_rubrics.py`` runs the builder; :mod:`score_lightning.rewards.items` is the verifier that
decides an item for a report.
"""
