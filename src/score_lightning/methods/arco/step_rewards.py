"""Step-level rewards (``reward.step=rubric``, ARCO-style): the evaluator judges every search step.

For each search step j of each solver trajectory (:mod:`score_lightning.rollout.search_steps`), the
evaluator role writes a short rubric (what a useful next query would achieve here, given the question
and the earlier searches) and scores the step against it (:mod:`score_lightning.methods.arco.judge`).

**Step score** (in [0, 1]): s_j = (relevance/10 + novelty/10 + cited_j) / 3, where relevance and
novelty are the evaluator's integers and cited_j = 1 when a document the step retrieved is cited
in the trajectory's final report (checked by the trainer). An invalid judgement has no score.

**Step advantage**: Â_j = (s_j − mean_g) / (std_g + ε) over every scored step of the query's K
trajectories (group g; unbiased std, as GRPO's); 0 when the group has fewer than two scores, when
they are all equal, or for an unscored step. The tokens of the turn that issued search j get
A_token = A_traj + λ·Â_j (λ = ``reward.step_lambda``); every other token keeps A_traj.

**Step-rubric reward** (the rubric writer co-evolves): per query, the Pearson correlation over its
trajectories between a trajectory's mean step score and its final reward R_s (undefined with fewer
than two scored trajectories or a constant side). Every valid judgement of the query earns it; an
invalid one earns ``reward.step_invalid_reward``. Centred by its own EMA baseline (β =
``evaluator.ema_beta``, pooled over ranks), the judgement tokens (up to ``</step_eval>``) join the
evaluator's one REINFORCE update of the step, weighted so that its loss is the mean over rubric
samples plus the mean over step judgements.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from score_lightning.rewards.functions import EMABaseline
from score_lightning.methods.arco.judge import STEP_EVAL_CLOSE, judgement_train_mask, parse_step_judgement, step_messages
from score_lightning.rollout.chat import encode_chat
from score_lightning.rollout.engine import RolloutEngine, SamplingParams, is_collective
from score_lightning.rollout.search_steps import search_steps
from score_lightning.rollout.stops import TagStops
from score_lightning.step.evaluator_objective import Bonuses, EvaluatorObjective, StepView
from score_lightning.step.evaluator_phase import centre, fold_rows
from score_lightning.step.objectives import STEP_CREDIT
from score_lightning.step.scalars import StepScalars
from score_lightning.step.solver_rows import TokenBonus

if TYPE_CHECKING:
    from score_lightning.config.schema import EvaluatorConfig, LossConfig, RewardConfig, SolverConfig

STEP_MODES = ("none", "rubric")


@dataclass(frozen=True)
class StepRewardSettings:
    """``reward.step*`` (and the evaluator's sampling settings the judgements use)."""

    mode: str  # reward.step
    lam: float  # reward.step_lambda
    max_tokens: int  # reward.step_max_tokens
    invalid_reward: float  # reward.step_invalid_reward
    temperature: float  # evaluator.temperature
    max_prompt_tokens: int  # solver.max_prompt_tokens
    eps: float  # loss.adv_eps


def step_reward_settings(reward: "RewardConfig", evaluator: "EvaluatorConfig", solver: "SolverConfig",
                         loss: "LossConfig") -> StepRewardSettings:
    """``reward.step*``, with the evaluator's sampling temperature the judgements use, the solver's prompt cap (a
    judgement's prompt holds the trajectory's searches) and the advantages' epsilon."""
    return StepRewardSettings(str(reward.step), float(reward.step_lambda), int(reward.step_max_tokens),
                              float(reward.step_invalid_reward), float(evaluator.temperature),
                              int(solver.max_prompt_tokens), float(loss.adv_eps))


@dataclass
class StepSample:
    """One step judgement's tokens, trained by REINFORCE like a rubric sample (same three fields)."""

    prompt_ids: list[int]
    response_ids: list[int]
    train_mask: list[int]
    valid: bool
    trajectory: int
    step: int
    engine_logprobs: list[float] | None = None  # the engine's log-prob of each response token (rollout_correction)


@dataclass
class StepJudgement:
    """A step's judgements on this rank; ``bonus is None`` when step rewards are off."""

    bonus: list[list[TokenBonus]] | None = None
    scores: list[list[float | None]] = field(default_factory=list)  # per trajectory, per step
    step_advantages: list[list[float]] = field(default_factory=list)  # Â_j per trajectory, per step
    agreement: list[float | None] = field(default_factory=list)  # per query
    samples: list[StepSample] = field(default_factory=list)
    rewards: list[float | None] = field(default_factory=list)  # per sample
    advantages: list[float] = field(default_factory=list)  # per sample with a reward, EMA-centred
    has_signal: bool = False  # some rank has a step-rubric reward (the same on every rank)

    def fold(self, trained: list | None, advantages: list[float]) -> tuple[list | None, list[float]]:
        """The evaluator's samples and advantages for its one update (``None``: no update on any rank).

        ``trained``/``advantages`` are the rows before this part (``None``: none train; the same on every rank).
        Step judgements join them; each part's advantages are scaled so that REINFORCE's mean over all rows equals
        mean(earlier parts) + mean(step part).
        """
        if self.bonus is None:
            return trained, advantages
        if trained is None and not self.has_signal:
            return None, []
        main, main_adv = (list(trained), list(advantages)) if trained is not None else ([], [])
        return fold_rows(main, main_adv, [s for s, r in zip(self.samples, self.rewards) if r is not None],
                         self.advantages)


class StepRewardStage(EvaluatorObjective):
    """The objective of ``reward.step=rubric``: judges the step's search steps, turns them into token bonuses,
    keeps the step-rubric baseline, and folds the judgements into the evaluator's update."""

    def __init__(self, settings: StepRewardSettings, ema_beta: float):
        if settings.mode not in STEP_MODES:
            raise ValueError(f"reward.step={settings.mode!r}: allowed {STEP_MODES}")
        self.settings = settings
        self.baseline = EMABaseline(ema_beta)
        self.judgement = StepJudgement()  # the step's, once judged

    def judge(self, step: StepView) -> Bonuses | None:
        """The step's :class:`StepJudgement`, kept for ``fold``; its token bonuses for the solver."""
        self.judgement = self.judge_steps(step.host.evaluator_engine, step.host.tokenizer, step.rollouts,
                                          step.rewards, step.scalars)
        return self.judgement.bonus

    def fold(self, trained: list | None, advantages: list[float]) -> tuple[list | None, list[float]]:
        return self.judgement.fold(trained, advantages)

    def judge_steps(self, engine: RolloutEngine, tokenizer, ro, rw, sc: StepScalars) -> StepJudgement:
        """Judge every search step of ``ro.solver`` (collective when on: generation lockstep, pooled baseline)."""
        s = self.settings
        if s.mode == "none":
            return StepJudgement()
        k = len(ro.solver) // max(1, len(ro.queries))
        steps = [search_steps(t, tokenizer) for t in ro.solver]
        where = [(i, st) for i, ss in enumerate(steps) for st in ss]
        prompts = [encode_chat(tokenizer, step_messages(ro.queries[i // k], st.earlier, st.query, st.doc_ids, st.passages),
                               s.max_prompt_tokens) for i, st in where]
        gens = self._generate(engine, tokenizer, prompts)
        out = StepJudgement(bonus=[[] for _ in steps], scores=[[None] * len(ss) for ss in steps])
        for (i, st), prompt, gen in zip(where, prompts, gens):
            ids = list(gen.token_ids)
            parsed = parse_step_judgement(tokenizer.decode(ids))
            cited = float(any(d in rw.answers[i].cited_ids for d in st.doc_ids))
            out.scores[i][st.index] = None if parsed.judged is None else (2.0 * parsed.judged + cited) / 3.0
            out.samples.append(StepSample(prompt, ids, judgement_train_mask(tokenizer, ids), parsed.valid, i, st.index,
                                          list(gen.logprobs) if gen.logprobs is not None else None))
        out.step_advantages = group_step_advantages(out.scores, k, s.eps)
        for i, ss in enumerate(steps):
            out.bonus[i] = [TokenBonus(st.row, st.start, st.end, s.lam * out.step_advantages[i][st.index]) for st in ss]
        out.agreement = [agreement(out.scores[g:g + k], rw.rewards[g:g + k].tolist()) for g in range(0, len(steps), k)]
        out.rewards = [(out.agreement[x.trajectory // k] if x.valid else s.invalid_reward) for x in out.samples]
        out.advantages, mean, _ = centre(out.rewards, self.baseline)
        out.has_signal = mean is not None
        self._record(sc, out, mean, rw.neutral.tolist())
        return out

    def _generate(self, engine: RolloutEngine, tokenizer, prompts: list[list[int]]) -> list:
        """One generate call for every judgement (a collective engine is joined even with none)."""
        stops = TagStops(tokenizer, [STEP_EVAL_CLOSE])
        if not prompts:
            if is_collective(engine):
                engine.generate([], SamplingParams(max_new_tokens=1, stop_token_ids=stops.token_ids))
            return []
        return engine.generate(prompts, SamplingParams(self.settings.max_tokens, self.settings.temperature,
                                                       stop_token_ids=stops.token_ids, stop_strings=stops.strings))

    def _record(self, sc: StepScalars, out: StepJudgement, mean: float | None, neutral: list[bool]) -> None:
        """Pooled over ranks (every rank calls this, in this order, whenever step rewards are on). The bonus mean is
        over what the solver's update adds: a neutral group's trajectories (``evaluator.on_incomplete=neutral``) get
        no step credit there."""
        flat = [v for row in out.scores for v in row]
        valid = [v for v in flat if v is not None]
        bonus = [abs(b.value) for row, off in zip(out.bonus or [], neutral) if not off for b in row]
        defined = [a for a in out.agreement if a is not None]
        sc.mean("solver/step_reward_mean", sum(valid), len(valid))
        sc.mean("solver/step_adv_abs_mean", sum(bonus), len(bonus))
        sc.mean("evaluator/step_rubric_valid_rate", float(len(valid)), len(flat))
        sc.mean("evaluator/step_agreement", sum(defined), len(defined))
        sc.mean("evaluator/step_rubric_reward", mean if mean is not None else 0.0, 1.0 if mean is not None else 0.0)
        sc.mean("evaluator/step_baseline", self.baseline.value, 1.0)

    def state_dict(self) -> dict:
        """Splatted into the checkpoint's ``score`` section."""
        return {"step_baseline": self.baseline.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("step_baseline") is not None:
            self.baseline.load_state_dict(state["step_baseline"])


def normalised(values: Sequence[float | None], eps: float = 1e-6) -> list[float]:
    """(v − mean) / (std + ε) over the values present (unbiased std, as GRPO's); 0 for a missing value, and 0 for
    every value when fewer than two are present or they are all equal."""
    vals = [v for v in values if v is not None]
    if len(vals) < 2 or max(vals) == min(vals):
        return [0.0] * len(values)
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
    return [0.0 if v is None else (v - mean) / (std + eps) for v in values]


def group_step_advantages(scores: Sequence[Sequence[float | None]], k: int, eps: float = 1e-6) -> list[list[float]]:
    """Â_j: each scored step normalised over its query's scored steps (unbiased std); 0 where undefined."""
    out: list[list[float]] = []
    for g in range(0, len(scores), k):
        group = scores[g:g + k]
        flat = normalised([v for row in group for v in row], eps)
        for row in group:
            out.append(flat[:len(row)])
            flat = flat[len(row):]
    return out


def agreement(scores: Sequence[Sequence[float | None]], rewards: Sequence[float]) -> float | None:
    """Pearson correlation between each trajectory's mean step score and its final reward; ``None`` if undefined."""
    pairs = [(sum(v for v in row if v is not None) / n, float(r))
             for row, r in zip(scores, rewards) if (n := sum(v is not None for v in row))]
    if len(pairs) < 2:
        return None
    xs, ys = zip(*pairs)
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    cov = sum((x - mx) * (y - my) for x, y in pairs)
    vx, vy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    if vx <= 1e-12 or vy <= 1e-12:
        return None
    return cov / math.sqrt(vx * vy)


def step_reward_stage(cfg) -> StepRewardStage:
    """``reward.step=rubric``'s objective from the run config (what ``STEP_CREDIT`` calls): its settings from the four
    nodes they come from, the baseline's beta from ``evaluator.ema_beta``."""
    return StepRewardStage(step_reward_settings(cfg.reward, cfg.evaluator, cfg.solver, cfg.loss),
                           float(cfg.evaluator.ema_beta))


STEP_CREDIT.register("rubric", step_reward_stage)
