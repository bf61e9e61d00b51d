"""What every demo kind shares: the :class:`Demo` record, its counts, the RL budgets it must fit,
and prompt/report tokenisation done exactly as ``ScoreModule`` does it.

Kept apart from the builders so the trainer (:mod:`score_lightning.sft.module`) and the probe can
use these types and helpers without importing the demo generators.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from score_lightning import protocol as P

if TYPE_CHECKING:
    from score_lightning.rollout.agent import AgentConfig
    from score_lightning.config.schema import EvaluatorConfig, SolverConfig

SOLVER, RUBRIC, SCORING = "solver", "rubric", "scoring"
#: ``sft.scoring_targets``: kind (a valid report's scores follow its kind) | items (and its evidence-item recall)
SCORING_TARGETS = ("kind", "items")
#: the report kinds a scoring demo draws, in draw order, and how often each is drawn:
#: close to what the evaluator meets at the first RL steps, where a third to a half of the cold start's answers
#: are invalid, most of them never closed ("(no report)") or uncited
SCORING_KINDS = ("good", "partial", "no_citation", "fake_citation", "unretrieved_citation", "truncated", "off_topic",
                 "empty")
KIND_WEIGHTS = (0.3, 0.1, 0.15, 0.05, 0.1, 0.05, 0.05, 0.2)


def kind_weights(overrides: dict[str, float] | None) -> tuple[float, ...]:
    """The draw weight of each kind in :data:`SCORING_KINDS` order: the defaults, with the kinds
    ``sft.scoring_kind_weights`` names replaced (e.g. more uncited reports, so the evaluator sees more reports whose
    citation check must find none). Unknown kinds, negative weights or all-zero weights are refused."""
    if not overrides:
        return KIND_WEIGHTS
    unknown = sorted(set(overrides) - set(SCORING_KINDS))
    if unknown:
        raise ValueError(f"sft.scoring_kind_weights: unknown kind(s) {unknown}; allowed {list(SCORING_KINDS)}")
    weights = tuple(float(overrides.get(k, w)) for k, w in zip(SCORING_KINDS, KIND_WEIGHTS))
    if any(not w >= 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"sft.scoring_kind_weights={dict(overrides)}: weights must be >= 0 and not all 0")
    return weights


@dataclass
class Demo:
    """One supervised example: prompt ids (never trained) + response ids with a loss mask."""

    kind: str
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    #: what the tests need to re-check the demo with the project's parsers
    meta: dict = field(default_factory=dict)
    #: demos with the same group share one prompt (the trainer encodes it once for all of them)
    group: int = -1

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


@dataclass
class DemoStats:
    built: dict = field(default_factory=lambda: {SOLVER: 0, RUBRIC: 0, SCORING: 0})
    dropped: dict = field(default_factory=lambda: {SOLVER: 0, RUBRIC: 0, SCORING: 0})


@dataclass(frozen=True)
class DemoBudgets:
    """The RL budgets the demonstrations must respect (same meaning as the config keys)."""

    max_prompt_tokens: int = 1024
    solver_max_response_tokens: int = 256
    solver_max_tool_calls: int = 3
    max_observation_tokens: int = 64
    topk: int = 2
    max_rubric_tokens: int = 96
    evaluator_max_response_tokens: int = 256
    evaluator_max_tool_calls: int = 2
    max_report_tokens: int = 96
    num_rollouts: int = 4
    scoring: str = "joint"  # evaluator.scoring: scoring demos over K reports (joint) or one (pointwise)
    show_retrieved: bool = False  # evaluator.show_retrieved: reports shown with the ids their searches returned
    #: evaluator.show_passages: (passage_tokens, max_cited_passages), each report shown with the passages it cites;
    #: None: off (left out of the cold start's key, so every existing key holds)
    passages: tuple[int, int] | None = None

    def solver_agent(self) -> AgentConfig:
        """The solver's agent config, built as ``ScoreModule.rollout`` builds it."""
        from score_lightning.rollout.agent import AgentConfig  # torch: the demo builder's, not the config checks'

        return AgentConfig(max_tool_calls=self.solver_max_tool_calls, max_response_tokens=self.solver_max_response_tokens,
                           max_observation_tokens=self.max_observation_tokens, topk=self.topk, finish_tag=P.ANSWER_CLOSE)

    def scoring_agent(self) -> AgentConfig:
        """The scoring agent config, built as ``ScoreModule.score_reports`` builds it."""
        from score_lightning.rollout.agent import AgentConfig

        return AgentConfig(max_tool_calls=self.evaluator_max_tool_calls,
                           max_response_tokens=self.evaluator_max_response_tokens,
                           max_observation_tokens=self.max_observation_tokens, topk=self.topk,
                           finish_tag=P.EVALS_CLOSE, allow_search=self.evaluator_max_tool_calls > 0)


def demo_budgets(solver: "SolverConfig", evaluator: "EvaluatorConfig") -> DemoBudgets:
    """The RL budgets of the run's ``solver`` and ``evaluator`` nodes, which the demonstrations must fit."""
    s, e = solver, evaluator
    return DemoBudgets(
        max_prompt_tokens=int(s.max_prompt_tokens), solver_max_response_tokens=int(s.max_response_tokens),
        solver_max_tool_calls=int(s.max_tool_calls), max_observation_tokens=int(s.max_observation_tokens),
        topk=int(s.topk), max_rubric_tokens=int(e.max_rubric_tokens),
        evaluator_max_response_tokens=int(e.max_response_tokens), evaluator_max_tool_calls=int(e.max_tool_calls),
        max_report_tokens=int(e.max_report_tokens), num_rollouts=int(s.num_rollouts),
        scoring=str(e.scoring), show_retrieved=bool(e.show_retrieved),
        passages=(int(e.passage_tokens), int(e.max_cited_passages)) if bool(e.show_passages) else None,
    )


@dataclass(frozen=True)
class ReportShape:
    """``sft.report``: solver demos as research reports (several searches, several cited findings).

    ``None`` (the default) keeps the one-to-two-claim answers the tiny model's packaged cold start
    learned, byte for byte; a shape draws each report's number of cited findings from ``claims`` and
    its number of searches from ``searches`` (both inclusive, searches capped by
    ``solver.max_tool_calls``). Scoring demos then show reports of the same shape.
    """

    claims: tuple[int, int] = (3, 5)
    searches: tuple[int, int] = (1, 3)


def report_shape(report) -> ReportShape | None:
    """The shape the ``sft.report`` node gives: ``None`` for ``sft.report: null``; a :class:`ValueError` naming the
    key for a bad range."""
    if report is None:
        return None
    out = {}
    for key in ("claims", "searches"):
        lo, hi = (int(x) for x in report[key])
        if not 1 <= lo <= hi:
            raise ValueError(f"sft.report.{key}: [lo, hi] with 1 <= lo <= hi, got {list(report[key])}")
        out[key] = (lo, hi)
    return ReportShape(**out)


def encode(tokenizer, text: str) -> list[int]:
    """``text``'s ids without special tokens, as a sampler would emit them."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
