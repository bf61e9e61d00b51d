"""The core's schema classes in one place, for type hints (``if TYPE_CHECKING: from score_lightning.config.schema
import OptimConfig``). The run's root class, with each method's nodes joined in, is built by
``build_schema`` in ``launch/schema.py``, the layer above that composes a run."""

from score_lightning.config.option_groups import (DDPStrategyConfig, FSDPStrategyConfig, HFRolloutConfig, HttpRetrieverConfig, McpRetrieverConfig,
                                                  RetrieverConfig, RolloutConfig, RubricConfig, ScoreRubricsConfig,
                                                  ScriptedRolloutConfig, StrategyConfig, VLLMRolloutConfig)
from score_lightning.config.run_groups import (ActorConfig, DataConfig, DebugConfig, HarnessConfig, JudgeConfig,
                                               LoggingConfig, LoraConfig, ModelConfig, PathsConfig, ThreadsConfig,
                                               TrainerConfig)
from score_lightning.config.step_groups import (CitationJudgeConfig, EvaluatorConfig, LossConfig, OptimConfig, RewardConfig, SolverConfig,
                                                VerifierConfig)

__all__ = ["ActorConfig", "CitationJudgeConfig", "DDPStrategyConfig", "FSDPStrategyConfig", "DataConfig", "DebugConfig", "EvaluatorConfig", "HFRolloutConfig", "HarnessConfig",
           "HttpRetrieverConfig", "JudgeConfig", "LoggingConfig", "LoraConfig", "LossConfig", "McpRetrieverConfig",
           "ModelConfig", "OptimConfig", "PathsConfig", "RetrieverConfig", "RewardConfig", "RolloutConfig",
           "RubricConfig", "ScoreRubricsConfig", "ScriptedRolloutConfig", "SolverConfig", "StrategyConfig",
           "ThreadsConfig", "TrainerConfig", "VLLMRolloutConfig", "VerifierConfig"]
