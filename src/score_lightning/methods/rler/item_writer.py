"""The evaluator role writing ``<rubric_items>`` blocks: one generation per prompt, with what REINFORCE needs.

Shared by RLER's item writer (:mod:`~score_lightning.methods.rler.evolving`) and DR-rubric's distillation
(:mod:`~score_lightning.methods.drrubric.dr_rubric`), so both train exactly the tokens up to ``</rubric_items>``.
"""

from __future__ import annotations

import os

from score_lightning.roles.rubric import rubric_token_span
from score_lightning.rollout.chat import encode_chat
from score_lightning.rollout.engine import SamplingParams
from score_lightning.rollout.stops import TagStops
from score_lightning.step.rubric_source import RubricContext
from score_lightning.methods.rler.items import ITEMS_CLOSE

#: (prompt ids, response ids, train mask, truncated, engine log-probs) of one written block
ItemRecord = tuple[list[int], list[int], list[int], bool, "list[float] | None"]


def generate_items(ctx: RubricContext, prompts: list[list[dict]], max_tokens: int) -> tuple[list[str], list[ItemRecord]]:
    """Each prompt's reply text and its record; the mask covers the response up to ``</rubric_items>``.

    The engine is called even with no prompt: a collective engine (FSDP) needs every rank.
    """
    ids = [encode_chat(ctx.tokenizer, m, ctx.max_prompt_tokens, key="evaluator.max_prompt_tokens") for m in prompts]
    stops = TagStops(ctx.tokenizer, [ITEMS_CLOSE])
    gens = ctx.engine.generate(ids, SamplingParams(max_tokens, ctx.temperature, stop_token_ids=stops.token_ids,
                                                   stop_strings=stops.strings))
    texts, records = [], []
    for prompt, gen in zip(ids, gens):
        resp = list(gen.token_ids)
        span = rubric_token_span(resp, ctx.tokenizer.decode, ITEMS_CLOSE)
        end = span[1] if span else len(resp)
        texts.append(ctx.tokenizer.decode(resp))
        records.append((prompt, resp, [1] * end + [0] * (len(resp) - end), gen.finish_reason == "length",
                        list(gen.logprobs) if gen.logprobs is not None else None))
    return texts, records


def external_writer(writer: str, external: dict | None):
    """``rubric.writer``: ``None`` for ``evaluator`` (the policy writes), else the OpenAI-compatible client that
    ``rubric.external`` names (``api_key_env``: the variable holding its key)."""
    if writer not in ("evaluator", "external"):
        raise ValueError(f"rubric.writer={writer!r}: allowed 'evaluator' or 'external'")
    if writer == "evaluator":
        return None
    from score_lightning.clients.chat import ChatClient

    ext = dict(external or {})
    key_env = ext.pop("api_key_env", "OPENAI_API_KEY")
    return ChatClient(api_key=os.environ.get(key_env) if key_env else None, **ext)
