"""``rubric=evolving``: RLER's buffer of rubric items (defaults and explanations: ``configs/rubric/evolving.yaml``)."""

from dataclasses import dataclass
from typing import Any

from score_lightning.config.fields import MISSING, knob
from score_lightning.config.option_groups import RubricConfig


@dataclass
class EvolvingRubricsConfig(RubricConfig):
    max_items: int = knob(ge=1)
    init_items: int = knob(ge=1)
    new_items: int = knob(ge=0)
    max_tokens: int = knob(ge=8)
    passages: int = knob(ge=0)
    max_report_chars: int = knob(ge=1)
    max_passages: int = knob(ge=0)
    max_passage_chars: int = knob(ge=1)
    evolve: bool = MISSING
    writer: str = knob(choices=("evaluator", "external"))
    external: Any = MISSING  # writer=external: {base_url, model, api_key_env}


#: the option schema its YAML names first (``configs/rubric/evolving.yaml``)
OPTIONS = {"rubric": {"schema_evolving": EvolvingRubricsConfig}}
