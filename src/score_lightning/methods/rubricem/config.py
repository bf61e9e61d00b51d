"""``solver.rubricem``: RubricEM's reflection memory (defaults and explanations: ``configs/train.yaml``)."""

from dataclasses import dataclass

from score_lightning.config.fields import MISSING, knob


@dataclass
class RubricEMConfig:
    reflection: bool = MISSING
    max_guidance_chars: int = knob(ge=0)


#: where this node sits in the run's config
NODES = {"solver.rubricem": RubricEMConfig}
#: the names it registers, by the config key that selects them (read before torch loads)
NAMES = {"solver.agent": ("rubricem",), "reward.step": ("stage",)}
