"""The schema of the groups whose options carry different keys: one class per option, sharing a base.

Each option's YAML names its class first in its defaults list (``configs/retriever/http.yaml``: ``- schema_http``),
so a key one option does not read is refused under it. ``rubric=evolving``, ``given`` and ``drrubric`` declare
theirs in their methods' folders.
"""

from dataclasses import dataclass
from typing import Any, Dict, Optional

from score_lightning.config.fields import MISSING, knob, node


@dataclass
class RolloutConfig:
    engine: str = knob(choices=("hf", "vllm", "scripted"))
    mode: str = knob(choices=("sync", "async"))
    max_staleness: int = knob(ge=0, why="policy versions (SCORE steps) a trained batch may lag behind the trainer; "
                                        "0: synchronous training with the generation in the worker")
    max_batch_size: int = knob(ge=1)


@dataclass
class HFRolloutConfig(RolloutConfig):
    grammar_fast_forward: bool = MISSING
    grammar_fast_forward_tokens: int = knob(ge=1)


@dataclass
class VLLMRolloutConfig(HFRolloutConfig):
    evaluator_engine: str = knob(choices=("vllm", "hf"), why="what the evaluator role generates with under a shared "
                                                              "actor")
    gpu_memory_utilization: float = knob(gt=0.0, le=1.0)
    tensor_parallel_size: int = knob(ge=1)
    max_model_len: int = knob(ge=1)
    enable_sleep_mode: bool = MISSING
    dtype: str = MISSING
    enforce_eager: bool = MISSING


@dataclass
class ScriptedRolloutConfig(RolloutConfig):
    responder: Any = MISSING  # {_target_: the scripted responder, ...its arguments}


@dataclass
class RetrieverConfig:
    kind: str = knob(choices=("bm25", "http", "mcp"))
    corpus_path: Optional[str] = MISSING
    index_dir: Optional[str] = MISSING
    url: Optional[str] = MISSING
    max_failed_steps: int = knob(ge=1)


@dataclass
class RemoteRetrieverConfig(RetrieverConfig):
    timeout_s: float = knob(gt=0.0, why="seconds per call")
    max_retries: int = knob(ge=0, le=10)
    serves_local_corpus: bool = MISSING
    probe_at_start: bool = MISSING


@dataclass
class HttpRetrieverConfig(RemoteRetrieverConfig):
    backoff_s: float = knob(ge=0.0)
    token_env: Optional[str] = MISSING


@dataclass
class McpFieldsConfig:
    results: Optional[str] = MISSING
    id: Optional[str] = MISSING
    title: Optional[str] = MISSING
    text: Optional[str] = MISSING
    score: Optional[str] = MISSING


@dataclass
class McpRetrieverConfig(RemoteRetrieverConfig):
    command: Any = MISSING  # stdio: the server's command line (a list, or a string split like a shell)
    env: Any = MISSING  # stdio: null or the server's environment (a mapping)
    tool: str = MISSING
    query_arg: str = MISSING
    topk_arg: Optional[str] = MISSING
    extra_args: Dict[str, Any] = MISSING
    fields: McpFieldsConfig = node(McpFieldsConfig)
    connect_timeout_s: float = knob(gt=0.0, why="seconds")


@dataclass
class StrategyConfig:
    _target_: str = MISSING
    name: str = knob(choices=("single", "ddp", "fsdp"))


@dataclass
class SingleStrategyConfig(StrategyConfig):
    accelerator: str = MISSING


@dataclass
class DDPStrategyConfig(StrategyConfig):
    shared_actor: bool = MISSING
    process_group_backend: Optional[str] = MISSING


@dataclass
class FSDPStrategyConfig(StrategyConfig):
    devices: Any = MISSING
    num_nodes: int = MISSING
    data_parallel_size: Any = MISSING  # 'auto' or an integer
    tensor_parallel_size: int = knob(ge=1)
    mixed_precision: Optional[str] = knob(choices=(None, "bf16", "bfloat16"))
    cpu_offload: bool = MISSING
    reshard_after_forward: bool = MISSING
    activation_checkpointing: bool = MISSING
    save_distributed_checkpoint: bool = MISSING


@dataclass
class RubricConfig:
    _target_: str = MISSING


@dataclass
class ScoreRubricsConfig(RubricConfig):
    max_tokens: int = knob(ge=1)
    max_queries: int = knob(ge=1)
    static: bool = MISSING
    weight_sum_tol: Optional[float] = MISSING


#: group -> option schema name -> class (stored in Hydra's ConfigStore under the group)
OPTION_SCHEMAS: Dict[str, Dict[str, type]] = {
    "rollout": {"schema_hf": HFRolloutConfig, "schema_vllm": VLLMRolloutConfig, "schema_scripted": ScriptedRolloutConfig},
    "retriever": {"schema_bm25": RetrieverConfig, "schema_http": HttpRetrieverConfig, "schema_mcp": McpRetrieverConfig},
    "strategy": {"schema_single": SingleStrategyConfig, "schema_ddp": DDPStrategyConfig,
                 "schema_fsdp": FSDPStrategyConfig},
    "rubric": {"schema_score": ScoreRubricsConfig},
}

