"""``Trajectory``: one multi-turn rollout, kept as exact token ids with a response mask.

A ReAct trajectory is one row: a prompt, then model turns (mask 1) interleaved with tool
observations (mask 0). A MaMs trajectory (``solver.agent=mams``) is several rows: each role call
(search, state, report) has its own bounded prompt and its own generated response, kept as a
:class:`Segment`. Observations then live inside the state role's prompts, so they are never
trained, and every segment's response is the policy's own tokens (mask 1). The trajectory-level
fields stay meaningful for both: ``response_ids`` is the concatenation of the segments' responses
(length metrics), ``model_text`` is the final report wrapped as ``<answer>…</answer>`` (validity,
citations and conclusions parse it unchanged), and ``rows()`` is what the GRPO update trains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from score_lightning.protocol import ANSWER_CLOSE, ANSWER_OPEN


@dataclass
class Segment:
    """One role call of a segmented (MaMs) trajectory: a bounded prompt and the policy's response.

    ``step`` is the index into the trajectory's ``search_queries`` when this segment issued that
    search (step-level rewards put their advantage on exactly these tokens), else ``None``.
    """

    role: str  # "search" | "state" | "report"
    turn: int
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    engine_logprobs: list[float]
    step: int | None = None


@dataclass
class Trajectory:
    """A prompt plus everything after it, as generated.

    ``response_ids`` interleaves model tokens (mask 1) and tool observations (mask 0). The ids are
    the engine's own samples, never a re-tokenisation of decoded text, so the trainer scores
    exactly what was sampled.
    """

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    #: the engine's (behaviour) log-prob of each response token: 0.0 on observation tokens, NaN on a model
    #: token the engine recorded none for; the mismatch metrics and ``optim.rollout_correction`` read them
    engine_logprobs: list[float] = field(default_factory=list)
    tool_calls: int = 0
    invalid_actions: int = 0
    retrieval_errors: int = 0
    retrieved_ids: list[str] = field(default_factory=list)
    search_queries: list[str] = field(default_factory=list)
    truncated: bool = False
    finished: bool = False
    meta: dict = field(default_factory=dict)
    #: MaMs role calls in generation order (empty for a ReAct trajectory)
    segments: list[Segment] = field(default_factory=list)
    #: MaMs: the final report (``None``: no complete report was written)
    report: str | None = None
    #: MaMs: the document ids each search step retrieved, aligned with ``search_queries``
    step_doc_ids: list[list[str]] = field(default_factory=list)
    #: MaMs: the text each search step showed its state role (the passages within the observation budget)
    step_passages: list[str] = field(default_factory=list)
    #: ``evaluator.score_readout=expected``: (index in ``response_ids``, expected value 0..10) of each score value
    #: it wrote, in order (:mod:`~score_lightning.rollout.value_readout`)
    value_readouts: list[tuple[int, float]] = field(default_factory=list)

    def append(self, ids: list[int], mask_value: int, logprobs: list[float] | None = None) -> None:
        self.response_ids.extend(ids)
        self.response_mask.extend([mask_value] * len(ids))
        if logprobs is None:  # NaN, not 0.0, on model tokens: a log-prob of 0 would read as probability 1
            logprobs = [0.0 if mask_value == 0 else math.nan] * len(ids)
        self.engine_logprobs.extend(logprobs)

    def add_segment(self, segment: Segment) -> None:
        """Record one role call; the trajectory-level token lists stay its concatenation."""
        self.segments.append(segment)
        self.append(segment.response_ids, 1, segment.engine_logprobs)

    def rows(self) -> list["Trajectory | Segment"]:
        """The (prompt, response, mask) rows the update trains: the segments, or the trajectory itself."""
        return list(self.segments) if self.segments else [self]

    @property
    def num_model_tokens(self) -> int:
        return sum(self.response_mask)

    def response_text(self, tokenizer) -> str:
        return tokenizer.decode(self.response_ids)

    def model_text(self, tokenizer) -> str:
        """Only the model-written tokens (observations removed): what validity and parsing judge.

        A segmented trajectory answers with its final report, wrapped as the ReAct solver's
        ``<answer>`` block, so one parser judges both workflows (no report: an empty string).
        """
        if self.segments:
            return f"{ANSWER_OPEN}{self.report}{ANSWER_CLOSE}" if self.report is not None else ""
        return tokenizer.decode([t for t, m in zip(self.response_ids, self.response_mask) if m])
