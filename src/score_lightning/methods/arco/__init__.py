"""arco"""

from score_lightning.methods.arco import demos, scripted  # noqa: F401  (they register)
