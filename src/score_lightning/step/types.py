"""Typed records passed between the stages of a SCORE step."""

from __future__ import annotations

from dataclasses import dataclass, field

from score_lightning.roles.evidence import EvidenceDoc
from score_lightning.roles.rubric import Rubric
from score_lightning.rollout.trajectory import Trajectory


@dataclass
class RubricSample:
    """The step's rubric and, when the evaluator wrote it, the tokens REINFORCE trains.

    ``prompt_ids``/``response_ids`` are ``None`` when no rubric was sampled (static rubric). An
    invalid sample keeps its tokens: the evaluator is still trained on them (with the
    ``invalid_rubric_reward``) while the solver is conditioned on the harness fallback ``rubric``.
    Plain data only, so rank 0 can broadcast it to every data-parallel rank.
    """

    rubric: Rubric
    valid: bool
    error: str = ""
    prompt_ids: list[int] | None = None
    response_ids: list[int] | None = None
    train_mask: list[int] | None = None  # 1 on the response tokens up to the end of </dimensions>
    truncated: bool = False
    engine_logprobs: list[float] | None = None  # the engine's log-prob of each response token (rollout_correction)
    policy_version: int | None = None  # the SCORE steps whose updates the sampling weights held (generation/generator.py)

    @property
    def sampled(self) -> bool:
        return self.response_ids is not None

    @property
    def num_tokens(self) -> int:
        return len(self.response_ids) if self.response_ids else 0


@dataclass
class StepRubric:
    """The rubric of every query of this rank's batch, and the evaluator tokens REINFORCE trains.

    ``samples`` pairs each generated rubric (its prompt and token ids) with the local query indices
    whose evaluator reward it earns, or ``None`` for the whole global batch (SCORE's one rubric per
    step). ``valid`` is false when some query fell back to the harness rubric (``fallback``).
    """

    per_query: list[Rubric]
    samples: list[tuple[RubricSample, list[int] | None]] = field(default_factory=list)
    valid: bool = True
    error: str = ""
    stats: dict[str, float] = field(default_factory=dict)
    fallback: list[bool] = field(default_factory=list)

    @property
    def first(self) -> Rubric:
        return self.per_query[0]

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s, _ in self.samples)


@dataclass
class StepRollouts:
    """Everything one SCORE step generated on this rank, kept together for rewards and logging."""

    queries: list[str]
    rubrics: StepRubric
    evidence: list[list[EvidenceDoc]]  # D_q^0: top documents per query (id and title)
    evidence_errors: int
    solver: list[Trajectory]  # query-major: query i's K rollouts at i*K .. i*K+K-1
    scoring: list[Trajectory] = field(default_factory=list)  # one per query
    query_ids: list[str] = field(default_factory=list)
