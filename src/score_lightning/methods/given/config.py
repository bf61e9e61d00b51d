"""``rubric=given``: rubrics read from a file (defaults and explanations: ``configs/rubric/given.yaml``)."""

from dataclasses import dataclass
from typing import Optional

from score_lightning.config.fields import MISSING, knob
from score_lightning.config.option_groups import RubricConfig


@dataclass
class GivenRubricsConfig(RubricConfig):
    path: str = MISSING
    include_explanation: bool = MISSING
    max_items: Optional[int] = knob(ge=1, why="null: every item")


#: the option schema its YAML names first (``configs/rubric/given.yaml``)
OPTIONS = {"rubric": {"schema_given": GivenRubricsConfig}}
