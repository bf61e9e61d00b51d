"""The ``RolloutEngine`` protocol: batched generation from token ids, with stops and logprobs.

Engines take and return *token ids*: the agent loop keeps every generated id exactly as sampled
and never re-tokenises the conversation (peers' users hit token drift doing that: TRL #5224,
verl #3960). The trainer recomputes its own logprobs (pi_old); the engine's (the behaviour policy mu)
feed the engine-trainer metrics and the importance weights of ``optim.rollout_correction``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Protocol, Sequence, runtime_checkable

import torch


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    #: generation stops right after any of these ids (kept in the output)
    stop_token_ids: tuple[int, ...] = ()
    #: for tokenizers where a tag spans several tokens: stop once the text ends with one of these
    stop_strings: tuple[str, ...] = ()
    logprobs: bool = True
    #: one Lark grammar per prompt that the generated text must match (``None``: free), or empty for
    #: none; the evaluator's constrained scoring (:mod:`score_lightning.rollout.constrained`). Logprobs stay
    #: those of the unconstrained distribution (scoring tokens are never trained).
    grammars: tuple[str | None, ...] = ()
    #: with ``grammars``: also return the expected value of every score value the grammar makes a row write
    #: (``evaluator.score_readout=expected``; ``Generation.extra["value_readouts"]``,
    #: :mod:`score_lightning.rollout.value_readout`). Only the HF engine's fast-forward decoder reads it; the
    #: other engines refuse it
    value_readout: bool = False


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float] | None = None
    #: "stop" (a stop id/string or EOS was produced) or "length" (hit max_new_tokens)
    finish_reason: str = "stop"
    extra: dict = field(default_factory=dict)


@runtime_checkable
class RolloutEngine(Protocol):
    """What the agent loop needs from a generator (HF ``generate``, vLLM, ...)."""

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """Continue each prompt; one :class:`Generation` per prompt, same order."""
        ...

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new policy weights (HF name, full tensor). A colocated engine sharing the module is a no-op."""
        ...


def is_collective(engine: RolloutEngine) -> bool:
    """True when ``generate`` is a collective call (an HF engine on an FSDP-sharded module): every rank
    must then call it the same number of times, with or without prompts of its own."""
    return bool(getattr(engine, "collective", False))
