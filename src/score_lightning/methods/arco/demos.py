"""Step-judgement demonstrations (``reward.step=rubric``): the evaluator's rubric and scores for one search.

Each prompt is a real step: a question, 0-2 earlier searches planned for it (with what they
retrieved), and the step's own search, which is either a planned query (good), a repeat of an
earlier one (low novelty) or a query written for another question (low relevance). Because the
kind of step is known, the scores can follow it: relevance from the words the search shares with
the question and whether it retrieved anything, novelty from whether it repeats an earlier search,
with a little jitter. Several responses (different rubric phrasings and jitter) share each prompt.
"""

from __future__ import annotations

import random

from score_lightning.methods.arco.judge import STEP_EVAL_CLOSE, STEP_EVAL_OPEN, STEP_RUBRIC_CLOSE, STEP_RUBRIC_OPEN
from score_lightning.methods.arco.judge import parse_step_judgement, step_messages
from score_lightning.rollout.agent import format_observation
from score_lightning.rollout.chat import encode_chat
from score_lightning.rollout.search_steps import observation_body
from score_lightning.sft.context import DemoContext
from score_lightning.sft.demo_registry import DEMO_SOURCES, DemoSource, ExtraKind
from score_lightning.sft.demo_types import Demo, encode
from score_lightning.sft.solver_demos import solver_plan
from score_lightning.roles.text import query_entities, query_keywords

STEP = "step"

_RUBRICS = (
    "A useful next query names {e} precisely.",
    "It should find a passage about {e} that the earlier searches missed.",
    "A good query targets {e} and retrieves new documents.",
    "It should cover what is still missing about {e}.",
)


def _scores(rng: random.Random, kind: str, overlap: int, found: bool) -> tuple[int, int]:
    """(relevance, novelty) for a step of a known kind, with jitter of at most one point."""
    relevance = {"good": 6 + min(overlap, 3), "repeat": 5 + min(overlap, 2), "off_topic": 1}[kind]
    relevance -= 0 if found else 2
    novelty = {"good": 8, "repeat": 1, "off_topic": 6}[kind]
    j = lambda v: int(min(10, max(0, v + rng.choice((-1, 0, 0, 1)))))  # noqa: E731
    return j(relevance), j(novelty)


def step_group(ctx: DemoContext, rng: random.Random, query: str, n: int, max_tokens: int) -> list[Demo]:
    """``n`` judgements of one step prompt for ``query``, each within ``max_tokens`` (``reward.step_max_tokens``)."""
    qs, hits = solver_plan(ctx, rng, query, rng.randint(1, 3))
    j = rng.randrange(len(qs))
    kind = rng.choices(["good", "repeat", "off_topic"], weights=[0.6, 0.2, 0.2])[0] if j > 0 else \
        rng.choices(["good", "off_topic"], weights=[0.75, 0.25])[0]
    earlier, search = qs[:j], qs[j]
    if kind == "repeat":
        search = rng.choice(earlier)
    elif kind == "off_topic":
        other = rng.choice([q for q in ctx.queries if q != query] or [query])
        other_qs, _ = solver_plan(ctx, rng, other, 1)
        search = other_qs[0]
    step_hits = ctx.retriever.search([search], ctx.b.topk)[0]
    obs_ids, doc_ids = format_observation(step_hits, ctx.b.max_observation_tokens, ctx.tok)  # as the solver saw it
    prompt = encode_chat(ctx.tok, step_messages(query, earlier, search, doc_ids, observation_body(ctx.tok.decode(obs_ids))))
    if len(prompt) > ctx.b.max_prompt_tokens:
        return []
    words = {w.lower() for w in query_keywords(query)} | {w.lower() for w in query_entities(query, ctx.known_ids)}
    overlap = len({w.lower() for w in search.replace(".", " ").split()} & words)
    names = query_entities(query, ctx.known_ids) or query_keywords(query)[:2] or ["the question"]
    out = []
    for _ in range(n):
        sub = random.Random(rng.random())
        rel, nov = _scores(sub, kind, overlap, bool(doc_ids))
        criterion = sub.choice(_RUBRICS).format(e=sub.choice(names))
        text = (f"{STEP_EVAL_OPEN}{STEP_RUBRIC_OPEN}{criterion}{STEP_RUBRIC_CLOSE}"
                f'<step_score relevance="{rel}" novelty="{nov}"/>{STEP_EVAL_CLOSE}')
        ids = encode(ctx.tok, text)
        if not parse_step_judgement(text).valid or len(ids) >= max_tokens:
            continue
        out.append(Demo(STEP, prompt, ids + [ctx.eos], [1] * (len(ids) + 1),
                        meta={"query": query, "kind": kind, "relevance": rel, "novelty": nov, "hits": len(hits)}))
    return out


def _key_fields(cfg, counts, on: bool) -> dict:
    """The step judgements' counts and budget in the SFT cache key (present, zeroed, while off: the packaged keys
    hold them)."""
    return {"num_step": int(counts["step"]) if on else 0, "step_per_prompt": int(counts["step_per_prompt"]),
            "step_max_tokens": int(cfg.reward.step_max_tokens)}


def _kinds(fields) -> list[ExtraKind]:
    if fields["num_step"] <= 0:
        return []
    max_tokens = fields["step_max_tokens"]
    return [ExtraKind(STEP, fields["num_step"], fields["step_per_prompt"],
                      lambda ctx, rng, query, n: step_group(ctx, rng, query, n, max_tokens))]


#: ``reward.step=rubric``: step judgements; after MaMs's among the sources
DEMO_SOURCES["reward.step"].register("rubric", DemoSource(1, {"step": 480, "step_per_prompt": 4}, _key_fields, _kinds))
