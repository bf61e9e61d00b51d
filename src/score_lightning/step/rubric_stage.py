"""Stage 1: the evaluator samples the step's rubric Gamma_t = (H_t, w_t), once per step.

Algorithm 1 samples *one* rubric per step for the whole batch. Under data parallelism rank 0
samples it from a prompt over the global batch's queries and broadcasts it with its token ids, so
4 GPUs train with one rubric, not four, and every rank trains REINFORCE on the same tokens.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from score_lightning import distributed as D
from score_lightning import protocol as P
from score_lightning.harness.scheduler import DimensionScheduler
from score_lightning.harness.state import HarnessState
from score_lightning.roles.evidence import EvidenceDoc
from score_lightning.roles.prompts import rubric_messages
from score_lightning.roles.rubric import WEIGHT_SUM_TOL, fallback_rubric, parse_rubric, rubric_token_span
from score_lightning.rollout.agent import TagStops
from score_lightning.rollout.chat import encode_chat
from score_lightning.rollout.engine import RolloutEngine, SamplingParams, is_collective
from score_lightning.step.types import RubricSample

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RubricSampling:
    """The evaluator's rubric-sampling settings (``evaluator.*`` in the config)."""

    max_tokens: int
    temperature: float
    max_prompt_tokens: int
    max_queries: int  # queries of the global batch shown in the rubric prompt
    static: bool = False  # never sample: always the harness fallback (plain GRPO baseline)
    weight_sum_tol: float | None = WEIGHT_SUM_TOL  # evaluator.rubric_weight_sum_tol (None: normalise the weights)


def train_mask(tokenizer, response_ids: Sequence[int]) -> list[int]:
    """1 on the tokens up to and including the end of the first ``</dimensions>``; all 1 if never closed.

    The same boundary the rubric parser reads, found on decoded text (see ``rubric_token_span``).
    """
    span = rubric_token_span(response_ids, tokenizer.decode)
    end = span[1] if span is not None else len(response_ids)
    return [1] * end + [0] * (len(response_ids) - end)


def rubric_prompt(queries: Sequence[str], evidence: Sequence[Sequence[EvidenceDoc]], state: HarnessState,
                  scheduler: DimensionScheduler, settings: RubricSampling, label_words: int | None = None) -> list[dict]:
    """The rubric prompt's messages: the first ``max_queries`` queries with their evidence (ids and titles).

    ``label_words`` cuts each document's label to that many words (0: ids only); ``None`` keeps it whole.
    """
    n = settings.max_queries
    docs = [[d if label_words is None else d.shortened(label_words) for d in row] for row in list(evidence)[:n]]
    return rubric_messages(list(queries)[:n], state, scheduler.required(), scheduler.avoided(), scheduler.explore(),
                           evidence=docs)


#: label lengths tried, longest first, when the rubric prompt does not fit its budget
_LABEL_FALLBACK = (None, 8, 0)


def fitted_rubric_prompt(tokenizer, queries: Sequence[str], evidence: Sequence[Sequence[EvidenceDoc]],
                         state: HarnessState, scheduler: DimensionScheduler, settings: RubricSampling) -> list[dict]:
    """The most detailed rubric prompt that fits ``evaluator.max_prompt_tokens``.

    Harness notes and scheduler hints grow during a run, and the evidence labels can then push the prompt past
    its budget mid-run; the labels are shortened (then dropped) before the prompt is refused.
    """
    for words in _LABEL_FALLBACK:
        messages = rubric_prompt(queries, evidence, state, scheduler, settings, words)
        if len(encode_chat(tokenizer, messages)) <= settings.max_prompt_tokens:
            break
    if words is not None:  # the last try goes on to encode_chat, which refuses it by name if it is still too long
        log.warning("rubric prompt over evaluator.max_prompt_tokens=%d: evidence labels cut to %d words",
                    settings.max_prompt_tokens, words)
    return messages


def sample_rubric(engine: RolloutEngine, tokenizer, messages: list[dict], state: HarnessState,
                  settings: RubricSampling) -> RubricSample:
    """Generate and parse one rubric; an invalid one falls back to the harness rubric (tokens kept)."""
    return sample_rubrics(engine, tokenizer, messages, state, settings, 1)[0]


def sample_rubrics(engine: RolloutEngine, tokenizer, messages: list[dict], state: HarnessState,
                   settings: RubricSampling, n: int) -> list[RubricSample]:
    """``n`` rubrics sampled from one prompt in one generate call (a group, as GRPO over rubrics samples them)."""
    if settings.static:
        return [RubricSample(fallback_rubric(state), True) for _ in range(n)]
    prompt = encode_chat(tokenizer, messages, settings.max_prompt_tokens, key="evaluator.max_prompt_tokens")
    stops = TagStops(tokenizer, [P.DIMENSIONS_CLOSE])
    params = SamplingParams(settings.max_tokens, settings.temperature, stop_token_ids=stops.token_ids,
                            stop_strings=stops.strings)
    out = []
    for gen in engine.generate([prompt] * n, params):
        ids = list(gen.token_ids)
        parsed = parse_rubric(tokenizer.decode(ids), state, settings.weight_sum_tol)
        ok = parsed.valid and parsed.rubric is not None
        out.append(RubricSample(
            rubric=parsed.rubric if ok else fallback_rubric(state),  # type: ignore[arg-type]
            valid=ok, error="" if ok else parsed.error, prompt_ids=prompt, response_ids=ids,
            train_mask=train_mask(tokenizer, ids), truncated=gen.finish_reason == "length",
            engine_logprobs=list(gen.logprobs) if gen.logprobs is not None else None,
        ))
    return out


def sample_step_rubric(engine: RolloutEngine, tokenizer, queries: Sequence[str],
                       evidence: Sequence[Sequence[EvidenceDoc]],
                       state: HarnessState, scheduler: DimensionScheduler, settings: RubricSampling) -> RubricSample:
    """One rubric for the whole global batch: rank 0 samples over every rank's queries, all receive it.

    Collective under data parallelism (every rank must call it). The prompt lists the global
    batch's queries in rank order, which is also the order of a single process on the same batch.
    A collective engine (HF generate on an FSDP-sharded model) needs every rank in each forward,
    so there every rank generates and rank 0's sample is kept.
    """
    gathered = D.gather_objects((list(queries), [list(e) for e in evidence]))
    messages = fitted_rubric_prompt(tokenizer, [q for qs, _ in gathered for q in qs],
                                    [e for _, es in gathered for e in es], state, scheduler, settings)
    sample = None
    if D.rank() == 0 or is_collective(engine):
        sample = sample_rubric(engine, tokenizer, messages, state, settings)
    return D.broadcast_object(sample)
