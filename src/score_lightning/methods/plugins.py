"""Import every shipped method's ``plugin`` module, so that each registers what it contributes."""

from score_lightning.methods.arco import plugin as arco  # noqa: F401
from score_lightning.methods.dpo import plugin as dpo  # noqa: F401
from score_lightning.methods.judge import plugin as judge  # noqa: F401
from score_lightning.methods.mams import plugin as mams  # noqa: F401
from score_lightning.methods.preference import plugin as preference  # noqa: F401
from score_lightning.methods.rler import plugin as rler  # noqa: F401
from score_lightning.methods.rubricem import plugin as rubricem  # noqa: F401
from score_lightning.methods.rule import plugin as rule  # noqa: F401
