"""The relatives of SCORE as plug-ins, one folder each: importing this package registers them.

The core (the step, rollouts, roles, rewards, policy, harness) never imports this package: it looks a method
up by the name a config key gives (:mod:`score_lightning.registry`), and the first lookup of an unknown name
imports this package once. Add a method by adding its folder and one import line below (docs/EXTENDING.md).
"""

from score_lightning.methods import arco  # noqa: F401
from score_lightning.methods import dpo  # noqa: F401
from score_lightning.methods import mams  # noqa: F401
from score_lightning.methods import preference  # noqa: F401
from score_lightning.methods import rler  # noqa: F401
from score_lightning.methods import rubricem  # noqa: F401
