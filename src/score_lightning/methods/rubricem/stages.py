"""Where each RubricEM stage lies in a trajectory's response tokens, from the tags the solver wrote.

plan = the tokens up to the one completing ``</plan>``; research = from there to the token where ``<review>`` starts
(the searches, and their observations, which carry mask 0 and so no credit); review = up to where ``<answer>``
starts; answer = the rest. A stage whose tags are missing has no span, and its tokens keep the trajectory's advantage
alone.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

from score_lightning import protocol as P
from score_lightning.methods.rubricem.prompts import PLAN_CLOSE, REVIEW_OPEN


def stage_spans(response_ids: Sequence[int], decode: Callable[[list[int]], str]) -> dict[str, tuple[int, int]]:
    """``{stage: (start, end)}`` token index ranges (end exclusive) of the stages whose tags are present, in order."""
    pieces = [decode([int(t)]) for t in response_ids]
    ends = []  # ends[i]: characters of the text through token i
    total = 0
    for p in pieces:
        total += len(p)
        ends.append(total)
    text = "".join(pieces)

    def token_at(char: int) -> int:  # the token holding character ``char``
        return bisect.bisect_right(ends, char)

    n = len(response_ids)
    close = text.find(PLAN_CLOSE)
    plan_end = token_at(close + len(PLAN_CLOSE) - 1) + 1 if close >= 0 else 0
    review = text.find(REVIEW_OPEN, close if close >= 0 else 0)
    answer = text.find(P.ANSWER_OPEN, review if review >= 0 else (close if close >= 0 else 0))
    review_start = token_at(review) if review >= 0 else None
    answer_start = token_at(answer) if answer >= 0 else None
    out: dict[str, tuple[int, int]] = {}
    if close >= 0:
        out["plan"] = (0, plan_end)
    research_end = review_start if review_start is not None else answer_start
    if research_end is not None and research_end > plan_end:
        out["research"] = (plan_end, research_end)
    if review_start is not None:
        out["review"] = (review_start, answer_start if answer_start is not None else n)
    if answer_start is not None:
        out["answer"] = (answer_start, n)
    return out
