"""The search steps of a solver trajectory: which tokens issued search j, and what it retrieved.

Step-level rewards (``reward.step=rubric``) judge each search and put its advantage on the tokens
that chose it. For a MaMs trajectory those are the search-role segment that issued the query (the
rollout records it, with the retrieved ids). For a ReAct trajectory they are found after the fact,
so the ReAct loop stays unchanged: a model turn is a maximal run of mask-1 tokens, a turn followed
by an observation that parses as a search is step j (in order of ``search_queries``), and the ids
it retrieved are the ``[doc_id]`` line heads of that observation (as ``format_observation`` writes
them, so only passages visible within the observation budget count). ``passages`` is the text the step showed:
the observation's body (ReAct) or what the search role's state update read (MaMs), so a step judge reads what it
judges, not only the ids.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from score_lightning import protocol as P
from score_lightning.roles.cited_passages import split_observation
from score_lightning.rollout.agent import parse_search_action
from score_lightning.rollout.trajectory import Trajectory

_OBS_ID_RE = re.compile(r"(?:^|<observation>)\[([^\]\s]+)\] ", re.MULTILINE)


@dataclass(frozen=True)
class SearchStep:
    """Search ``index`` of a trajectory: its query, the queries before it, what it retrieved, its tokens."""

    index: int
    query: str
    earlier: tuple[str, ...]
    doc_ids: tuple[str, ...]
    passages: str  # the text the search showed (its passages, cut to the observation budget)
    row: int  # the trajectory's training row holding the tokens (0 for ReAct, the segment for MaMs)
    start: int  # response token offsets of the step's turn in that row
    end: int


def search_steps(traj: Trajectory, tokenizer) -> list[SearchStep]:
    """Every valid search of ``traj`` in order, aligned with ``traj.search_queries``."""
    qs = traj.search_queries
    if traj.segments:
        out = []
        for row, seg in enumerate(traj.segments):
            if seg.step is not None and seg.step < len(qs):
                ids = traj.step_doc_ids[seg.step] if seg.step < len(traj.step_doc_ids) else []
                shown = traj.step_passages[seg.step] if seg.step < len(traj.step_passages) else ""
                out.append(SearchStep(seg.step, qs[seg.step], tuple(qs[:seg.step]), tuple(ids), shown, row, 0,
                                      len(seg.response_ids)))
        return out
    runs = _runs(traj.response_mask)
    out = []
    for n, (start, end, value) in enumerate(runs):
        if value != 1 or n + 1 >= len(runs) or len(out) >= len(qs):
            continue
        action = parse_search_action(tokenizer.decode(traj.response_ids[start:end]))
        if action.kind != "search" or action.query != qs[len(out)]:
            continue
        o_start, o_end, _ = runs[n + 1]
        shown = tokenizer.decode(traj.response_ids[o_start:o_end])
        ids = tuple(dict.fromkeys(_OBS_ID_RE.findall(shown)))
        j = len(out)
        out.append(SearchStep(j, qs[j], tuple(qs[:j]), ids, observation_body(shown), 0, start, end))
    return out


def observation_body(text: str) -> str:
    """The passages of a decoded observation, without its tags and surrounding newlines."""
    return text.strip().removeprefix(P.OBS_OPEN).removesuffix(P.OBS_CLOSE).strip()


def _runs(mask: list[int]) -> list[tuple[int, int, int]]:
    """Maximal runs of equal mask values as (start, end, value)."""
    out: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((start, i, mask[start]))
            start = i
    return out


def shown_passages(traj: Trajectory, tokenizer) -> dict[str, str]:
    """Each passage the trajectory's searches showed, by id: the text its observation carried of it (cut by the
    observation budget), the first showing kept. What ``evaluator.show_passages`` falls back on for a retriever
    without a local corpus, what RLER's contrast and DR Tulu's citation term read: a ReAct trajectory's
    observations, or what a MaMs search role read."""
    out: dict[str, str] = {}
    for step in search_steps(traj, tokenizer):
        for doc_id, text in split_observation(step.passages):
            if text:
                out.setdefault(doc_id, text)
    return out
