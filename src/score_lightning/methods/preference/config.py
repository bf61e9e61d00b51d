"""``evaluator.preference``: how a preference-trained rubric writer's pairs are scored (defaults and
explanations: ``configs/train.yaml``)."""

from dataclasses import dataclass
from typing import Any, Optional

from score_lightning.config.fields import MISSING, knob


@dataclass
class PreferenceRewardConfig:
    _target_: str = MISSING
    path: Optional[str] = MISSING
    pairs_per_step: int = knob(ge=1)
    group_size: int = knob(ge=1, why="1: the step's rubric scores the pairs; G >= 2: G rubrics per pair, trained by "
                                      "GRPO")
    appraisal_weight: float = knob(ge=0.0, le=1.0)
    appraisal: Any = MISSING  # null or {base_url, model, api_key_env}
    seed: int = MISSING


#: where this node sits in the run's config
NODES = {"evaluator.preference": PreferenceRewardConfig}
#: the names it registers, by the config key that selects them (read before torch loads)
NAMES = {"evaluator.reward": ("preference",)}
