"""The schema of the step's groups: the solver, the evaluator, the verifier, the reward, the loss and the optimiser.

Each field states its type and what it allows; its default and its explanation are in ``configs/train.yaml``
beside the key. A method's own node (``solver.mams``, ``solver.dpo``, ``evaluator.preference``, ...) is declared in
the method's folder and joined to these classes by ``launch/schema.py`` (the core names no method).
Choices that plug-ins extend (``solver.agent``, ``optim.loss_type``, ``evaluator.reward``, ...) are checked against
their registries by the cross-key rules, not listed here.
"""

from dataclasses import dataclass
from typing import List, Optional

from score_lightning.config.fields import MISSING, knob, node


@dataclass
class DynamicSamplingConfig:
    enabled: bool = MISSING
    max_draws: int = knob(ge=1, le=16, why="draws per SCORE step, the first included")


@dataclass
class SolverConfig:
    num_rollouts: int = knob(ge=2, why="GRPO normalises over the K rollouts of a query")
    freeze: bool = MISSING
    objective: str = knob(registry=("grpo",), registered="solver objectives")
    max_tool_calls: int = knob(ge=0, le=10)
    max_response_tokens: int = knob(ge=8)
    max_prompt_tokens: int = knob(ge=8)
    max_observation_tokens: int = knob(ge=1)
    topk: int = knob(ge=1, le=100)
    temperature: float = knob(gt=0.0, why="RL needs sampling")
    top_p: float = knob(gt=0.0, le=1.0)
    conclusion_line: bool = MISSING
    dynamic_sampling: DynamicSamplingConfig = node(DynamicSamplingConfig)
    mask_truncated: bool = MISSING
    agent: str = knob(registry=("react",), registered="solver workflows")


@dataclass
class ConstrainedMaxChars:
    think: int = knob(ge=1)
    query: int = knob(ge=1)
    section: int = knob(ge=1)
    reason: int = knob(ge=1)


@dataclass
class EvaluatorConfig:
    enabled: bool = MISSING
    source: str = knob(registry=("policy",), registered="evaluator sources")
    update_every: int = knob(ge=1)
    ema_beta: float = knob(ge=0.0, lt=1.0)
    alpha: float = knob(ge=0.0)
    optimizer: str = knob(choices=("own", "shared"),
                          why="own: lr alpha * optim.lr, its own Adam moments; shared: the solver's AdamW state")
    temperature: float = knob(gt=0.0)
    scoring_temperature: Optional[float] = knob(ge=0.0, why="null: evaluator.temperature; 0: greedy")
    scoring: str = knob(choices=("joint", "pointwise"),
                        why="joint: one evaluation of all K reports; pointwise: one evaluation per report")
    on_incomplete: str = knob(choices=("validity", "drop", "neutral"),
                              why="validity: an unjudged report's reward is a(r); drop: it leaves the update; "
                                  "neutral: its group gets advantage 0")
    show_retrieved: bool = MISSING
    show_passages: bool = MISSING
    passage_tokens: int = knob(ge=1)
    max_cited_passages: int = knob(ge=1)
    constrained_scoring: bool = MISSING
    constrained_max_chars: ConstrainedMaxChars = node(ConstrainedMaxChars)
    score_readout: str = knob(choices=("sampled", "expected"),
                              why="sampled: the value the evaluator wrote; expected: its expected value over 0..10")
    max_rubric_tokens: int = knob(ge=8)
    max_response_tokens: int = knob(ge=8)
    max_tool_calls: int = knob(ge=0, le=10)
    max_observation_tokens: int = knob(ge=1)
    max_report_tokens: int = knob(ge=1)
    max_prompt_tokens: int = knob(ge=8)
    invalid_rubric_reward: float = MISSING
    static_rubric: bool = MISSING
    reward: str = knob(registry=("consistency", "discriminative", "solver_reward"), registered="evaluator rewards")
    scoring_reward: str = knob(choices=("none", "pairwise_recall"),
                               why="none: scoring tokens never train (the paper); pairwise_recall: REINFORCE on "
                                   "whether the scores order the reports as their item_recall does")
    preferences_path: Optional[str] = MISSING
    rubric_queries: int = knob(ge=1)
    rubric_weight_sum_tol: Optional[float] = knob(ge=0.0, le=1.0, why="null: weights normalised, sum not checked")


@dataclass
class VerifierConfig:
    enabled: bool = MISSING
    min_search_depth: int = knob(ge=0, le=10)
    tau_from_harness: bool = MISSING
    zero: str = knob(choices=("reward", "scores"), why="reward: Algorithm 1, s_i^k = 0; scores: keep a(r)")


@dataclass
class OverlongConfig:
    enabled: bool = MISSING
    buffer_len: Optional[int] = knob(ge=1, why="tokens before the cap where the penalty grows; null: a fifth of it")
    penalty_factor: float = knob(ge=0.0, why="the penalty at the cap")


@dataclass
class CitationJudgeConfig:
    enabled: bool = MISSING
    weight: float = knob(ge=0.0, why="the citation term's weight in the reward")
    max_claims: int = knob(ge=1, why="claims of a report sent to the judge")
    max_passage_chars: int = knob(ge=1)


@dataclass
class RewardConfig:
    source: str = knob(registry=("evaluator",), registered="reward sources")
    rule_quality: str = knob(choices=("retrieved_cited", "coverage", "item_recall", "none"),
                             why="q(r) of reward.source=rule")
    items_path: Optional[str] = MISSING
    require_citation: bool = MISSING
    citations: str = knob(choices=("any", "retrieved"),
                          why="any: any bracketed id counts; retrieved: cited ids must be among the retrieved ones")
    min_answer_chars: int = knob(ge=0)
    overlong: OverlongConfig = node(OverlongConfig)
    citation_judge: CitationJudgeConfig = node(CitationJudgeConfig)
    step: str = knob(registry=("none",), registered="step credits")
    step_lambda: float = knob(ge=0.0, why="weight of the step advantage")
    step_max_tokens: int = knob(ge=8)
    step_invalid_reward: float = knob(ge=-1.0, le=1.0, why="valid judgements earn a correlation")


@dataclass
class LossConfig:
    kl_coef: float = knob(ge=0.0)
    entropy_coef: float = knob(ge=0.0)
    adv_eps: float = knob(gt=0.0)
    kl_clamp: float = knob(gt=0.0)
    kl_is_weighted: bool = MISSING


@dataclass
class OptimConfig:
    loss_type: str = knob(registry=("bnpo", "cispo", "dapo", "dr_grpo", "grpo", "grpo_seq_mean", "gspo"))
    clip_ratio_low: float = knob(ge=0.0, le=1.0, why="the ratio's lower clip is 1 - it; 1: none")
    clip_ratio_high: float = knob(ge=0.0, why="the upper clip is 1 + it")
    scale_rewards: str = knob(registry=("batch", "group", "none"))
    lr: float = knob(gt=0.0)
    weight_decay: float = knob(ge=0.0)
    betas: List[float] = MISSING
    eps: float = knob(gt=0.0)
    warmup_steps: int = knob(ge=0)
    warmup_start_ratio: float = knob(ge=0.0, le=1.0)
    grad_clip: float = knob(ge=0.0, why="0 disables clipping")
    ppo_epochs: int = knob(ge=1)
    mini_batch_size: int = knob(ge=1, why="queries per optimiser step")
    micro_batch_size: int = knob(ge=1, why="trajectories per forward/backward")
    share_prompt_forward: bool = MISSING
    reuse_frozen_bottom: bool = MISSING
    max_consecutive_skips: int = knob(ge=1)
    rollout_correction: str = MISSING
    rollout_correction_clip_min: Optional[float] = knob(ge=0.0, le=1.0, why="a ratio of 1, where engine and trainer "
                                                                              "agree, must keep its weight")
    rollout_correction_clip_max: float = knob(ge=1.0, why="C_max, never null: an unbounded weight is one long "
                                                          "trajectory away from inf")
