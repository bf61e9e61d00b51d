"""Stage-Structured GRPO (RubricEM): stagewise judgements as per-stage credit.

**Stage advantage.** For stage j (plan, research, review, answer) the judge's score s_ij of trajectory i in [0, 1] is
normalised over the query's K trajectories that have it: Â_ij = (s_ij − mean_j) / (std_j + ε) (unbiased std, as
GRPO's); 0 where a stage has fewer than two scores, where they are all equal, or for an unscored stage. Each stage is
normalised on its own: a good plan is compared with the other plans, not with answers.

**Per-token advantage.** The tokens of stage j of trajectory i get A_i + λ·Â_ij, where A_i is the trajectory's GRPO
advantage from its final reward (``reward.step_lambda``); tokens outside every stage span keep A_i.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from score_lightning import distributed as D
from score_lightning import protocol as P
from score_lightning.methods.rubricem.prompts import (
    PLAN_CLOSE, PLAN_OPEN, REVIEW_CLOSE, REVIEW_OPEN, STAGES, parse_stage_scores, stage_judge_messages,
)
from score_lightning.rollout.chat import encode_chat
from score_lightning.rollout.engine import RolloutEngine, SamplingParams
from score_lightning.methods.rubricem.stages import stage_spans
from score_lightning.rollout.stops import TagStops
from score_lightning.step.evaluator_objective import Bonuses, EvaluatorObjective, StepView
from score_lightning.step.objectives import STEP_CREDIT
from score_lightning.step.scalars import StepScalars
from score_lightning.step.solver_rows import TokenBonus
from score_lightning.methods.arco.step_rewards import StepJudgement, normalised

if TYPE_CHECKING:
    from score_lightning.config.schema import EvaluatorConfig, LossConfig, RewardConfig, SolverConfig


def stage_advantages(scores: Sequence[Mapping[str, float] | None], k: int,
                     eps: float = 1e-6) -> list[dict[str, float]]:
    """Â per trajectory and stage, each stage normalised over its query group of ``k`` trajectories."""
    out: list[dict[str, float]] = [{} for _ in scores]
    for g in range(0, len(scores), k):
        group = range(g, min(g + k, len(scores)))
        for stage in STAGES:
            values = [None if scores[i] is None else scores[i].get(stage) for i in group]
            for i, a in zip(group, normalised(values, eps)):
                out[i][stage] = a
    return out


def stage_bonuses(spans: Mapping[str, tuple[int, int]], advantages: Mapping[str, float], lam: float,
                  row: int = 0) -> list[TokenBonus]:
    """λ·Â_j on the tokens of each stage span the trajectory has (one row: a RubricEM trajectory is one ReAct row)."""
    return [TokenBonus(row, start, end, lam * advantages.get(stage, 0.0))
            for stage, (start, end) in spans.items() if end > start and advantages.get(stage, 0.0) != 0.0]


@dataclass(frozen=True)
class StageCreditSettings:
    """``reward.step=stage``: λ (``reward.step_lambda``), the judge's budget and sampling (the evaluator's)."""

    lam: float  # reward.step_lambda
    max_tokens: int  # reward.step_max_tokens
    temperature: float  # evaluator.temperature
    max_prompt_tokens: int  # evaluator.max_prompt_tokens
    eps: float  # loss.adv_eps
    reflection: bool  # solver.rubricem.reflection: keep guidance per query for its later prompts
    max_guidance_chars: int  # solver.rubricem.max_guidance_chars
    max_stage_chars: int = 600  # each stage's text in the judge's prompt (not a config key)


def stage_credit_settings(reward: "RewardConfig", solver: "SolverConfig", evaluator: "EvaluatorConfig",
                          loss: "LossConfig") -> StageCreditSettings:
    """``reward.step=stage``'s settings: λ and the judge's budget (``reward``), the reflection memory
    (``solver.rubricem``), the judge's sampling and prompt cap (``evaluator``), the advantages' epsilon (``loss``)."""
    em = solver.rubricem
    return StageCreditSettings(float(reward.step_lambda), int(reward.step_max_tokens), float(evaluator.temperature),
                               int(evaluator.max_prompt_tokens), eps=float(loss.adv_eps),
                               reflection=bool(em.reflection), max_guidance_chars=int(em.max_guidance_chars))


class StageCreditStage(EvaluatorObjective):
    """The objective of ``reward.step=stage``: judges each RubricEM trajectory's stages and turns the stage scores into
    token bonuses (nothing to fold into the evaluator's update: the judge's rubric is the trajectory's own plan, which
    the policy rewrites as it learns)."""

    def __init__(self, settings: StageCreditSettings):
        self.settings = settings
        #: the reflection memory (``solver.rubricem.reflection``): query id -> guidance for its next prompt
        self.memory: dict[str, str] = {}
        self.judgement = StepJudgement()  # the step's, once judged

    def guidance(self, query_ids: Sequence[str]) -> list[str] | None:
        """Each query's stored guidance ("" when none); ``None`` when the memory is off."""
        return [self.memory.get(str(q), "") for q in query_ids] if self.settings.reflection else None

    def state_dict(self) -> dict:
        """Splatted into the checkpoint's ``score`` section: every rank's memory (a rank remembers the queries it saw;
        called on every rank, as the rubric buffers are)."""
        return {"reflection_memory": D.gather_objects(dict(self.memory))}

    def load_state_dict(self, state: dict) -> None:
        self.memory = {}
        for part in state.get("reflection_memory") or []:
            self.memory.update(part)

    def judge(self, step: StepView) -> Bonuses | None:
        """The step's stage judgements, kept (``judgement``); their token bonuses for the solver (collective)."""
        self.judgement = self.judge_stages(step.host.evaluator_engine, step.host.tokenizer, step.rollouts,
                                           step.rewards, step.scalars)
        return self.judgement.bonus

    def judge_stages(self, engine: RolloutEngine, tokenizer, ro, rw, sc: StepScalars) -> StepJudgement:
        s = self.settings
        k = len(ro.solver) // max(1, len(ro.queries))
        texts = [tokenizer.decode(t.response_ids) for t in ro.solver]
        prompts = [encode_chat(tokenizer, stage_judge_messages(ro.queries[i // k], *stage_texts(text, s.max_stage_chars,
                                                                                                 t.search_queries)),
                               s.max_prompt_tokens, key="evaluator.max_prompt_tokens")
                   for i, (t, text) in enumerate(zip(ro.solver, texts))]
        stops = TagStops(tokenizer, ["/>"])
        gens = engine.generate(prompts, SamplingParams(s.max_tokens, s.temperature, stop_token_ids=stops.token_ids,
                                                       stop_strings=stops.strings))
        scores = [parse_stage_scores(tokenizer.decode(list(g.token_ids))) for g in gens]
        advs = stage_advantages(scores, k, s.eps)
        spans = [stage_spans(t.response_ids, tokenizer.decode) for t in ro.solver]
        bonus = [stage_bonuses(sp, a, s.lam) for sp, a in zip(spans, advs)]
        for stage in STAGES:
            sc.mean(f"stage/{stage}_present", sum(stage in sp for sp in spans), len(spans))
            vals = [x[stage] for x in scores if x is not None]
            if vals:
                sc.mean(f"stage/{stage}_score", sum(vals), len(vals))
        sc.mean("stage/judge_valid_rate", sum(x is not None for x in scores), len(scores))
        if s.reflection:
            for g, qid in enumerate(ro.query_ids):
                note = reflection(texts[g * k:(g + 1) * k], scores[g * k:(g + 1) * k],
                                  rw.rewards[g * k:(g + 1) * k].tolist(), s.max_guidance_chars)
                if note:
                    self.memory[str(qid)] = note
            sc.mean("stage/memory_size", len(self.memory), 1)
        return StepJudgement(bonus=bonus, scores=[[None if x is None else x[st] for st in STAGES] for x in scores],
                             step_advantages=[[a[st] for st in STAGES] for a in advs])


def reflection(texts: Sequence[str], scores: Sequence[Mapping[str, float] | None], rewards: Sequence[float],
               max_chars: int) -> str:
    """A query's guidance from its judged group: the plan of its best-rewarded trajectory that wrote one, and the
    stage the group's judged trajectories scored lowest on average ("" when no trajectory wrote a plan)."""
    order = sorted(range(len(texts)), key=lambda i: -rewards[i])
    plan = next((p for i in order if (p := stage_texts(texts[i], max_chars, [])[0])), "")
    if not plan:
        return ""
    judged = [x for x in scores if x is not None]
    weakest = min(STAGES, key=lambda st: sum(x[st] for x in judged) / len(judged)) if judged else None
    tail = f" Weakest stage last time: {weakest}." if weakest else ""
    return f"A plan that earned the best reward: {plan}{tail}"[: max_chars + 40]


def stage_texts(text: str, max_chars: int, searches: Sequence[str]) -> tuple[str, list[str], str, str]:
    """(plan, searches, review, answer) of a decoded RubricEM response, each cut to ``max_chars``."""
    def between(open_: str, close: str) -> str:
        start = text.find(open_)
        end = text.find(close, start + len(open_)) if start >= 0 else -1
        return text[start + len(open_):end].strip()[:max_chars] if end >= 0 else ""

    return (between(PLAN_OPEN, PLAN_CLOSE), list(searches), between(REVIEW_OPEN, REVIEW_CLOSE),
            between(P.ANSWER_OPEN, P.ANSWER_CLOSE))


STEP_CREDIT.register("stage", lambda cfg: StageCreditStage(stage_credit_settings(cfg.reward, cfg.solver, cfg.evaluator,
                                                                                  cfg.loss)))
