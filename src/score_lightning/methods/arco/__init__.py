"""arco"""

from score_lightning.methods.arco import demos, scripted, step_rewards  # noqa: F401  (they register)
