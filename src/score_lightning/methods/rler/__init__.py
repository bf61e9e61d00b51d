"""rler"""

from score_lightning.methods.rler import demos, scripted  # noqa: F401  (they register)
