"""The evaluator's step judgement (``reward.step=rubric``, ARCO-style): a short rubric for one search step,
and the step's scores against it.

Format (one block; its tags are several tokens in the tiny tokenizer):

    <step_eval><rubric>what a useful next query would achieve here</rubric>
    <step_score relevance="0-10" novelty="0-10"/></step_eval>

*relevance*: how well the query serves the question given the trajectory so far; *novelty*: how much
it differs from the earlier queries. Whether the step's results were cited in the final report is a
fact the trainer checks itself (:mod:`score_lightning.methods.arco.step_rewards`), not a judgement.
The parser never raises: an unusable judgement is a :class:`StepJudgeParse` with ``valid=False`` and
a :class:`StepJudgeError` naming the first rule it broke.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from score_lightning.roles.prompts import Message
from score_lightning.roles.rubric import rubric_token_span

STEP_EVAL_OPEN, STEP_EVAL_CLOSE = "<step_eval>", "</step_eval>"
STEP_RUBRIC_OPEN, STEP_RUBRIC_CLOSE = "<rubric>", "</rubric>"

STEP_SYSTEM = (
    "You are the evaluator of one search step of a research agent. First write a short rubric: what a "
    "useful next query would achieve here, given the question and the earlier searches. Then score this "
    "step's query against it, integers 0-10 (10 best):\n"
    f'{STEP_EVAL_OPEN}{STEP_RUBRIC_OPEN}criterion{STEP_RUBRIC_CLOSE}<step_score relevance="7" novelty="5"/>'
    f"{STEP_EVAL_CLOSE}\n"
    "relevance: the query serves the question; novelty: it differs from the earlier queries."
)


class StepJudgeError(str, Enum):
    """Why a step judgement is unusable (the first rule broken, in this order)."""

    NO_BLOCK = "no closed <step_eval> block"
    NO_RUBRIC = "no <rubric> criterion"
    EMPTY_RUBRIC = "empty rubric"
    NO_SCORE = "no <step_score> with relevance and novelty"
    NOT_INTEGER = "a score is not an integer"
    OUT_OF_RANGE = "a score is outside 0-10"


@dataclass(frozen=True)
class StepJudgeParse:
    valid: bool
    rubric: str = ""
    relevance: int | None = None
    novelty: int | None = None
    error: StepJudgeError | None = None

    @property
    def judged(self) -> float | None:
        """The judged part of the step score, in [0, 1]: the mean of relevance and novelty / 10."""
        if not self.valid:
            return None
        return (self.relevance + self.novelty) / 20.0  # type: ignore[operator]


_BLOCK_RE = re.compile(re.escape(STEP_EVAL_OPEN) + r"(.*?)" + re.escape(STEP_EVAL_CLOSE), re.DOTALL)
_RUBRIC_RE = re.compile(re.escape(STEP_RUBRIC_OPEN) + r"(.*?)" + re.escape(STEP_RUBRIC_CLOSE), re.DOTALL)
_SCORE_RE = re.compile(r"<step_score\s+([^>]*?)/?>")
_ATTR_RE = re.compile(r'(\w+)\s*=\s*"([^"]*)"')


def parse_step_judgement(text: str) -> StepJudgeParse:
    """The first ``<step_eval>`` block's rubric and scores; typed invalid results, never raises."""
    if not isinstance(text, str):
        return StepJudgeParse(False, error=StepJudgeError.NO_BLOCK)
    block = _BLOCK_RE.search(text)
    if block is None:
        return StepJudgeParse(False, error=StepJudgeError.NO_BLOCK)
    body = block.group(1)
    rubric = _RUBRIC_RE.search(body)
    if rubric is None:
        return StepJudgeParse(False, error=StepJudgeError.NO_RUBRIC)
    criterion = rubric.group(1).strip()
    if not criterion:
        return StepJudgeParse(False, error=StepJudgeError.EMPTY_RUBRIC)
    score = _SCORE_RE.search(body[rubric.end():])
    attrs = dict(_ATTR_RE.findall(score.group(1))) if score else {}
    if "relevance" not in attrs or "novelty" not in attrs:
        return StepJudgeParse(False, criterion, error=StepJudgeError.NO_SCORE)
    try:
        rel, nov = int(attrs["relevance"].strip()), int(attrs["novelty"].strip())
    except ValueError:
        return StepJudgeParse(False, criterion, error=StepJudgeError.NOT_INTEGER)
    if not (0 <= rel <= 10 and 0 <= nov <= 10):
        return StepJudgeParse(False, criterion, error=StepJudgeError.OUT_OF_RANGE)
    return StepJudgeParse(True, criterion, rel, nov)


def step_messages(query: str, earlier: Sequence[str], search: str, doc_ids: Sequence[str],
                  passages: str = "") -> list[Message]:
    """System: the step-eval format. User: the question, the earlier searches, this search, its result ids and the
    passages it showed (ARCO's step judge reads what the step retrieved, not only its ids)."""
    before = "\n".join(f"{i}. {q}" for i, q in enumerate(earlier, 1)) or "(none)"
    found = " ".join(f"[{d}]" for d in doc_ids) or "(nothing)"
    user = (f"Question: {query.strip()}\n\nEarlier searches:\n{before}\n\nThis search: {search.strip()}\n\n"
            f"It retrieved: {found}" + (f"\n\nWhat it showed:\n{passages.strip()}" if passages.strip() else ""))
    return [{"role": "system", "content": STEP_SYSTEM}, {"role": "user", "content": user}]


def judgement_train_mask(tokenizer, response_ids: Sequence[int]) -> list[int]:
    """1 on the tokens up to and including the end of the first ``</step_eval>`` (all 1 if never closed),
    the boundary the rubric stage uses for ``</dimensions>``."""
    span = rubric_token_span(response_ids, tokenizer.decode, close=STEP_EVAL_CLOSE)
    end = span[1] if span is not None else len(response_ids)
    return [1] * end + [0] * (len(response_ids) - end)
