"""``rubric=drrubric``: DR-rubric's search-grounded rubric writer (defaults and explanations:
``configs/rubric/drrubric.yaml``)."""

from dataclasses import dataclass
from typing import Any

from score_lightning.config.fields import MISSING, knob
from score_lightning.config.option_groups import RubricConfig


@dataclass
class DrRubricConfig(RubricConfig):
    search_turns: int = knob(ge=0)
    topk: int = knob(ge=1)
    max_observation_tokens: int = knob(ge=1)
    max_research_tokens: int = knob(ge=8)
    num_items: int = knob(ge=1)
    max_items: int = knob(ge=1)
    max_item_tokens: int = knob(ge=8)
    max_findings_chars: int = knob(ge=0)
    max_passages: int = knob(ge=0)
    max_passage_chars: int = knob(ge=1)
    iterations: int = knob(ge=1)
    iteration_steps: int = knob(ge=0)
    train_writer: bool = MISSING
    writer: str = knob(choices=("evaluator", "external"))
    external: Any = MISSING  # writer=external: {base_url, model, api_key_env}


#: the option schema its YAML names first (``configs/rubric/drrubric.yaml``)
OPTIONS = {"rubric": {"schema_drrubric": DrRubricConfig}}
