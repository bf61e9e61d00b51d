"""``sft``: the cold start's schema (its defaults and explanations: ``configs/sft/default.yaml``)."""

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from score_lightning.config.fields import MISSING, knob, node
from score_lightning.config.run_groups import LoraConfig


@dataclass
class ResponsesPerPrompt:
    solver: int = knob(ge=1)
    rubric: int = knob(ge=1)
    scoring: int = knob(ge=1)


@dataclass
class SftProbeConfig:
    num_rubrics: int = knob(ge=0)
    num_solver: int = knob(ge=0)
    num_scoring: int = knob(ge=0)


@dataclass
class SftConfig:
    enabled: Any = MISSING  # true, false or 'auto' (on for the tiny model only)
    num_solver_demos: int = knob(ge=0)
    num_rubric_demos: int = knob(ge=0)
    num_scoring_demos: int = knob(ge=0)
    report: Any = MISSING  # null or {claims: [lo, hi], searches: [lo, hi]} (its shape: sft.demo_types.report_shape)
    scoring_contrast: float = knob(ge=0.0, le=1.0, why="a share of scoring prompts built as one report and its "
                                                        "minimal edits")
    scoring_targets: str = knob(choices=("kind", "items"),
                                why="kind: scores follow the report's kind; items: a valid report's scores also "
                                    "follow its item_recall")
    scoring_kind_weights: Any = MISSING  # null or report kind -> weight (sft.demo_types.kind_weights)
    responses_per_prompt: ResponsesPerPrompt = node(ResponsesPerPrompt)
    shared_prompt: bool = MISSING
    prompt_loss_weight: float = knob(ge=0.0)
    epochs: int = knob(ge=1)
    max_steps: int = knob(ge=-1, why="-1: epochs decide")
    batch_size: int = knob(ge=1)
    lr: float = knob(gt=0.0)
    min_lr_ratio: float = knob(ge=0.0, le=1.0)
    warmup_steps: int = knob(ge=0)
    weight_decay: float = knob(ge=0.0)
    betas: List[float] = MISSING
    grad_clip: float = knob(ge=0.0)
    trainable_layers: Optional[int] = knob(ge=1, why="null: all weights train; N: the top N decoder layers")
    lora: LoraConfig = node(LoraConfig)
    max_seq_len: int = knob(ge=8)
    precision: str = MISSING
    seed: int = knob(ge=0)
    cache_dir: str = MISSING
    log_every_n_steps: int = knob(ge=1)
    log_samples: bool = MISSING
    probe: SftProbeConfig = node(SftProbeConfig)
    use_packaged: bool = MISSING
    workflow_demos: Dict[str, int] = MISSING  # a method's cold-start demonstration counts, by its own names
