"""RubricEM's solver scaffold and stage judge: the prompts and a forgiving parser.

The solver works in four stages, each conditioned on a rubric it writes itself first:

* **plan**: ``<plan><rubric_items>…</rubric_items></plan>``, what its report must satisfy (the RLER item format);
* **research**: ``<search>…</search>`` calls (observations come back as in the ReAct loop);
* **review**: ``<review>…</review>``, what the searches found against the plan, and what is missing;
* **answer**: ``<answer>…</answer>``, the cited report.

The stage judge reads the trajectory's stages and the plan's items and scores each stage 0-10 in one line:
``<stage_scores plan="7" research="5" review="6" answer="8"/>``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from score_lightning import protocol as P
from score_lightning.harness.state import HarnessState
from score_lightning.roles.prompts import CONCLUSION_INSTRUCTION, format_rubric
from score_lightning.roles.rubric import Rubric
from score_lightning.methods.rler.items import ITEMS_CLOSE, ITEMS_OPEN

PLAN_OPEN, PLAN_CLOSE = "<plan>", "</plan>"
REVIEW_OPEN, REVIEW_CLOSE = "<review>", "</review>"
STAGE_SCORES_TAG = "stage_scores"
STAGES = ("plan", "research", "review", "answer")

RUBRICEM_SYSTEM = (
    "You are a deep-research agent that works in four stages. 1. Plan: write the rubric your report must satisfy, "
    f'{PLAN_OPEN}{ITEMS_OPEN}<item weight="0.5">a check</item>{ITEMS_CLOSE}{PLAN_CLOSE}. 2. Research: search the corpus '
    f"with {P.SEARCH_OPEN}query{P.SEARCH_CLOSE} (at most {{max_tool_calls}} searches; results come back in "
    f"{P.OBS_OPEN}…{P.OBS_CLOSE}). 3. Review: {REVIEW_OPEN}what you found against each planned item, and what is "
    f"missing{REVIEW_CLOSE}. 4. Answer: {P.ANSWER_OPEN}your report, citing documents as [doc_id]{P.ANSWER_CLOSE}.\n"
    f"{CONCLUSION_INSTRUCTION}"
)

STAGE_JUDGE_SYSTEM = (
    "You are the stage judge. Score each stage of a research trajectory from 0 to 10 against the agent's own plan: "
    "plan (are its items specific and checkable for the question), research (did the searches find what the plan "
    "needs), review (does it check the findings against the plan honestly), answer (does the report satisfy the plan "
    f'with cited evidence). Output exactly one line: <{STAGE_SCORES_TAG} plan="0-10" research="0-10" review="0-10" '
    'answer="0-10"/>'
)

_SCORES_RE = re.compile(rf"<{STAGE_SCORES_TAG}((?:\s+\w+\s*=\s*\"[^\"]*\")*)\s*/>")
_ATTR_RE = re.compile(r"(\w+)\s*=\s*\"([^\"]*)\"")


def rubricem_messages(query: str, rubric: Rubric, state: HarnessState, max_tool_calls: int,
                      guidance: str = "") -> list[dict]:
    """System: the four stages and the budget. User: the question, the rubric it will be judged on, and the
    reflection memory's guidance from earlier attempts at it (when there is any)."""
    user = f"Question: {query.strip()}\n\nRubric:\n{format_rubric(rubric, state)}"
    if guidance.strip():
        user += f"\n\nGuidance from earlier attempts:\n{guidance.strip()}"
    return [{"role": "system", "content": RUBRICEM_SYSTEM.format(max_tool_calls=max_tool_calls)},
            {"role": "user", "content": user}]


def stage_judge_messages(query: str, plan: str, searches: Sequence[str], review: str, answer: str) -> list[dict]:
    """The judge sees the question and each stage's text (the searches as their queries)."""
    listed = "\n".join(f"- {q}" for q in searches) or "- (no search)"
    user = (f"Question: {query.strip()}\n\n[Plan]\n{plan.strip() or '(none)'}\n\n[Research: searches]\n{listed}\n\n"
            f"[Review]\n{review.strip() or '(none)'}\n\n[Answer]\n{answer.strip() or '(none)'}")
    return [{"role": "system", "content": STAGE_JUDGE_SYSTEM}, {"role": "user", "content": user}]


def parse_stage_scores(text: str) -> dict[str, float] | None:
    """Each stage's score in [0, 1] (the integer / 10); ``None`` unless every stage has an integer 0-10. Never raises."""
    m = _SCORES_RE.search(text if isinstance(text, str) else "")
    if m is None:
        return None
    attrs = dict(_ATTR_RE.findall(m.group(1)))
    out = {}
    for stage in STAGES:
        value = attrs.get(stage, "").strip()
        if not value.isdigit() or not 0 <= int(value) <= 10:
            return None
        out[stage] = int(value) / 10.0
    return out
