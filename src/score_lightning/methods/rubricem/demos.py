"""RubricEM's cold-start demonstrations (``solver.agent=rubricem``, ``reward.step=stage``).

* ``rubricem``: four-stage trajectories replayed through the real agent loop: a plan whose items check what the first
  search shows, 1-3 searches, a review that names the ids found for the plan, and the cited ReAct answer;
* ``stage_judge``: stage judgements of trajectories of known quality (a plan or none, searches or none, a review that
  cites what was found or one that does not, a cited or an uncited answer), with scores that follow each stage.
"""

from __future__ import annotations

import random

from score_lightning import protocol as P
from score_lightning.methods.rubricem.prompts import (
    PLAN_CLOSE, PLAN_OPEN, REVIEW_CLOSE, REVIEW_OPEN, STAGE_SCORES_TAG, parse_stage_scores, rubricem_messages,
    stage_judge_messages,
)
from score_lightning.rollout.chat import encode_chat
from score_lightning.sft.context import DemoContext
from score_lightning.sft.demo_registry import DEMO_SOURCES, DemoSource, ExtraKind
from score_lightning.sft.demo_types import Demo, encode
from score_lightning.methods.rler.demos import evidence_items, items_text, query_names, shown_evidence
from score_lightning.sft.solver_demos import answer_for, solver_plan, solver_prompt

RUBRICEM, STAGE_JUDGE = "rubricem", "stage_judge"


def _plan(rng: random.Random, names: list[str], evidence: list[tuple[str, str]]) -> str:
    return f"{PLAN_OPEN}{items_text(evidence_items(rng, names, evidence, rng.randint(2, 3)))}{PLAN_CLOSE}"


def _review(found: list[str], names: list[str], honest: bool) -> str:
    if honest and found:
        return f"{REVIEW_OPEN}Found {', '.join(f'[{d}]' for d in found[:2])} for {names[0]}; the plan's other checks " \
               f"need the answer to cite them.{REVIEW_CLOSE}"
    return f"{REVIEW_OPEN}Looks complete.{REVIEW_CLOSE}"


def rubricem_group(ctx: DemoContext, rng: random.Random, query: str, n: int) -> list[Demo]:
    """``n`` four-stage trajectories for one prompt (one harness state and rubric), within the solver's budgets."""
    b = ctx.b
    built = solver_prompt(ctx, rng, query, rubricem_messages)
    if built is None:
        return []
    _, rubric, prompt = built
    names = query_names(ctx, query)
    out = []
    for _ in range(n):
        sub = random.Random(rng.random())
        for attempt in range(3):
            qs, hits = solver_plan(ctx, sub, query, max(1, min(b.solver_max_tool_calls, sub.randint(1, 3) - attempt)))
            shown = [e for hs in hits for e in shown_evidence(ctx, hs, b.max_observation_tokens)]
            answer = answer_for(ctx, sub, query, hits, rubric, max(1, 2 - attempt))
            if not shown or not answer:
                continue
            turns = [f"{_plan(sub, names, shown[:2])}{P.SEARCH_OPEN}{qs[0]}{P.SEARCH_CLOSE}"]
            turns += [f"{P.SEARCH_OPEN}{q}{P.SEARCH_CLOSE}" for q in qs[1:]]
            turns.append(f"{_review([d for d, _ in shown], names, True)}{P.ANSWER_OPEN}{answer}{P.ANSWER_CLOSE}")
            traj = ctx.script(turns, prompt, b.solver_agent())
            if traj.finished and not traj.truncated and len(traj.response_ids) + 1 <= b.solver_max_response_tokens \
                    and traj.search_queries == qs:
                out.append(Demo(RUBRICEM, prompt, traj.response_ids + [ctx.eos], traj.response_mask + [1],
                                meta={"query": query, "search_queries": list(qs), "answer": answer}))
                break
    return out


def stage_judge_group(ctx: DemoContext, rng: random.Random, query: str, n: int, max_tokens: int = 96) -> list[Demo]:
    """``n`` judgements of one trajectory of known quality: each stage's score follows what that stage shows."""
    qs, hits = solver_plan(ctx, rng, query, rng.randint(1, 2))
    shown = [e for hs in hits for e in shown_evidence(ctx, hs, ctx.b.max_observation_tokens)]
    answer = answer_for(ctx, rng, query, hits, None, 2)
    if not shown or not answer:
        return []
    names = query_names(ctx, query)
    has_plan, searched, honest, cited = (rng.random() < p for p in (0.75, 0.8, 0.6, 0.7))
    plan = _plan(rng, names, shown[:2])[len(PLAN_OPEN):-len(PLAN_CLOSE)] if has_plan else ""
    review = _review([d for d, _ in shown], names, honest)[len(REVIEW_OPEN):-len(REVIEW_CLOSE)]
    text = answer if cited else " ".join(w for w in answer.split() if not w.startswith("["))
    prompt = encode_chat(ctx.tok, stage_judge_messages(query, plan, qs if searched else [], review, text))
    if len(prompt) > ctx.b.max_prompt_tokens:
        return []
    base = {"plan": 7 if has_plan else 1, "research": 7 if searched else 1, "review": 8 if honest else 3,
            "answer": 8 if cited else 3}
    out = []
    for _ in range(n):
        j = {k: int(min(10, max(0, v + rng.choice((-1, 0, 0, 1))))) for k, v in base.items()}
        line = f"<{STAGE_SCORES_TAG} " + " ".join(f'{k}="{v}"' for k, v in j.items()) + "/>"
        ids = encode(ctx.tok, line)
        if parse_stage_scores(line) is None or len(ids) >= max_tokens:
            continue
        out.append(Demo(STAGE_JUDGE, prompt, ids + [ctx.eos], [1] * (len(ids) + 1), meta={"query": query, **j}))
    return out


def _later_fields(name: str):
    """Fields added after cold starts were packaged: in the SFT cache key only while on with a non-zero count, so
    every other key (the packaged ones) is unchanged."""
    def key_fields(cfg, counts, on: bool) -> dict:
        n = int(counts[name]) if on else 0
        return {f"num_{name}": n, f"{name}_per_prompt": int(counts[f"{name}_per_prompt"])} if n else {}
    return key_fields


def _rubricem_kinds(fields) -> list[ExtraKind]:
    n = fields.get("num_rubricem", 0)
    return [ExtraKind(RUBRICEM, n, fields["rubricem_per_prompt"], rubricem_group)] if n > 0 else []


def _stage_kinds(fields) -> list[ExtraKind]:
    n = fields.get("num_stage", 0)
    return [ExtraKind(STAGE_JUDGE, n, fields["stage_per_prompt"], stage_judge_group)] if n > 0 else []


#: ``solver.agent=rubricem``: four-stage trajectories; ``reward.step=stage``: stage judgements (the last two sources)
DEMO_SOURCES["solver.agent"].register("rubricem", DemoSource(
    3, {"rubricem": 480, "rubricem_per_prompt": 4}, _later_fields("rubricem"), _rubricem_kinds))
DEMO_SOURCES["reward.step"].register("stage", DemoSource(
    4, {"stage": 480, "stage_per_prompt": 4}, _later_fields("stage"), _stage_kinds))
