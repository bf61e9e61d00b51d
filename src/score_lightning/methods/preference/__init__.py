"""preference"""

from score_lightning.methods.preference import objective  # noqa: F401  (it registers)
