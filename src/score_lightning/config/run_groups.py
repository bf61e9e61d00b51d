"""The schema of the run's groups: threads, the model, the data, the trainer, the judge and the meta-harness.

Each field states its type and what it allows; its default and its explanation are in the YAML beside the key
(``configs/train.yaml`` and the group's files). A field that mixes types (``threads.num``: ``auto`` or an integer)
is ``Any`` here and judged by the cross-key rules (``launch/config_validation/``, the layer above that composes a run).
"""

from dataclasses import dataclass
from typing import Any, List, Optional

from score_lightning.config.fields import MISSING, knob, node


@dataclass
class ThreadsConfig:
    num: Any = MISSING  # 'auto' or an integer >= 1
    runs: int = knob(ge=1, why="independent runs sharing this machine's cores")
    wait_policy: Optional[str] = knob(choices=(None, "passive", "active"), why="OMP_WAIT_POLICY")


@dataclass
class ActorConfig:
    shared: bool = MISSING


@dataclass
class LoggingConfig:
    text_every_n_steps: int = knob(ge=1)


@dataclass
class DebugConfig:
    nan_grad_steps: List[int] = MISSING


@dataclass
class PathsConfig:
    root_dir: str = MISSING
    log_dir: str = MISSING
    output_dir: str = MISSING
    cache_dir: str = MISSING


@dataclass
class TrainerConfig:
    accelerator: str = knob(choices=("cpu", "gpu", "cuda", "auto"))
    devices: Any = MISSING  # an integer, a list of device ids or 'auto' (Lightning's)
    num_nodes: int = knob(ge=1)
    max_steps: int = knob(ge=1, why="SCORE steps")
    precision: str = knob(choices=("32-true", "32", "bf16-mixed", "bf16-true", "64-true"),
                          why="fp16 with a grad scaler is not supported")
    log_every_n_steps: int = knob(ge=1)
    enable_progress_bar: bool = MISSING
    malloc_mmap_threshold_mb: Optional[float] = knob(ge=0.0, le=32.0, why="MB, glibc's maximum is 32")


@dataclass
class DataConfig:
    queries_path: Optional[str] = MISSING
    split: Optional[str] = MISSING
    batch_size: int = knob(ge=1)
    num_workers: int = knob(ge=0)


@dataclass
class TinyModelConfig:
    vocab_size: int = knob(ge=1)
    hidden_size: int = knob(ge=1)
    intermediate_size: int = knob(ge=1)
    num_hidden_layers: int = knob(ge=1)
    num_attention_heads: int = knob(ge=1)
    num_key_value_heads: int = knob(ge=1)
    max_position_embeddings: int = knob(ge=1)
    seed: int = knob(ge=0)


@dataclass
class GgufConfig:
    package: str = MISSING
    file: str = MISSING
    install: str = MISSING


@dataclass
class LoraConfig:
    enabled: bool = MISSING
    r: int = knob(ge=1, why="the adapter rank")
    alpha: float = knob(gt=0.0, why="scaling = alpha / r")
    target_modules: Any = MISSING  # 'all-linear' or a list of module names
    dropout: float = knob(ge=0.0, lt=1.0)


@dataclass
class ModelConfig:
    name_or_path: Optional[str] = MISSING
    dtype: str = knob(choices=("float32", "fp32", "bfloat16", "bf16", "float16", "fp16"))
    allow_low_precision_weights: bool = MISSING
    gradient_checkpointing: bool = MISSING
    trainable_layers: Optional[int] = knob(ge=1, why="null: all weights train; N: the top N decoder layers")
    tiny: Optional[TinyModelConfig] = MISSING
    chat_template: Optional[str] = MISSING
    lora: LoraConfig = node(LoraConfig)
    gguf: Optional[GgufConfig] = None  # model=smollm2_135m: a GGUF inside an installed package


@dataclass
class JudgeConfig:
    base_url: str = MISSING
    model: str = MISSING
    api_key_env: Optional[str] = MISSING  # null: no key (a local server)
    max_concurrency: int = knob(ge=1, why="calls in flight in the whole run, shared by every caller")
    requests_per_minute: int = knob(ge=0, why="0: unlimited")
    queue_timeout_s: float = knob(gt=0.0, why="seconds a call may wait for a free slot")
    timeout_s: float = knob(gt=0.0, why="seconds: each call's hard deadline")
    max_retries: int = knob(ge=0, le=10)
    max_failed_rate: float = knob(ge=0.0, le=1.0, why="a step above it stops the run")
    temperature: float = knob(ge=0.0)
    max_tokens: int = knob(ge=1)
    extra_body: Any = MISSING  # null or extra request fields (a mapping)


@dataclass
class DimensionConstraints:
    k: int = MISSING
    must_include: List[str] = MISSING
    weight_min: float = MISSING
    weight_max: float = MISSING


@dataclass
class ProcessConstraints:
    require_gap_analysis: bool = MISSING
    require_verification: bool = MISSING
    citation_cross_check: bool = MISSING
    min_number_of_tool_call: int = MISSING


@dataclass
class HarnessStateConfig:
    dimension_constraints: DimensionConstraints = node(DimensionConstraints)
    process_constraints: ProcessConstraints = node(ProcessConstraints)
    notes: str = MISSING


@dataclass
class SchedulerConfig:
    ema_decay: float = knob(ge=0.0, le=1.0)
    min_count_required: int = knob(ge=0)
    required_threshold: float = MISSING
    avoid_threshold: float = MISSING
    explore_below_count: int = knob(ge=0)
    max_hints: int = knob(ge=0)


@dataclass
class HarnessConfig:
    backend: Any = MISSING  # {_target_: a harness class, ...its arguments}: harness=rule or llm
    enabled: bool = MISSING
    every_n_steps: int = knob(ge=1)
    initial_state: HarnessStateConfig = node(HarnessStateConfig)
    scheduler: SchedulerConfig = node(SchedulerConfig)
