"""rubricem"""

from score_lightning.methods.rubricem import demos, scripted, workflow  # noqa: F401  (they register)
