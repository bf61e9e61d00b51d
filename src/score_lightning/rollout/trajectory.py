"""``Trajectory``: one multi-turn rollout, kept as exact token ids with a response mask."""

from __future__ import annotations

from dataclasses import dataclass, field


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
    #: engine logprob per response token (0.0 on observation tokens); only for the mismatch metric
    engine_logprobs: list[float] = field(default_factory=list)
    tool_calls: int = 0
    invalid_actions: int = 0
    retrieval_errors: int = 0
    retrieved_ids: list[str] = field(default_factory=list)
    search_queries: list[str] = field(default_factory=list)
    truncated: bool = False
    finished: bool = False
    meta: dict = field(default_factory=dict)

    def append(self, ids: list[int], mask_value: int, logprobs: list[float] | None = None) -> None:
        self.response_ids.extend(ids)
        self.response_mask.extend([mask_value] * len(ids))
        if logprobs is None:
            logprobs = [0.0] * len(ids)
        self.engine_logprobs.extend(logprobs)

    @property
    def num_model_tokens(self) -> int:
        return sum(self.response_mask)

    def response_text(self, tokenizer) -> str:
        return tokenizer.decode(self.response_ids)

    def model_text(self, tokenizer) -> str:
        """Only the model-written tokens (observations removed): what validity and parsing judge."""
        return tokenizer.decode([t for t, m in zip(self.response_ids, self.response_mask) if m])
