"""rubricem"""

from score_lightning.methods.rubricem import credit, demos, scripted, workflow  # noqa: F401  (they register)
