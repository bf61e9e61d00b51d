"""Item-writing demonstrations for the rubric writers that write natural-language items: RLER (``rubric=evolving``)
and DR-rubric (``rubric=drrubric``). Without them a cold-started model never closes ``</rubric_items>`` and every
query falls back to the harness rubric (``rubric/write_fail_rate`` 1.0).

Four kinds, each in the exact prompt format the rubric source sends:

* ``items_init``: RLER's first visit (the question and its top passages) -> items that check what those passages say;
* ``items_contrast``: RLER's later visits (current items, a cited best and an uncited worst report with their
  passages) -> new items that tell them apart;
* ``research``: DR-rubric's Stage I, replayed through the real agent loop (real searches and observations) -> notes
  ``<findings>`` that cite what the searches showed;
* ``distil``: DR-rubric's Stage II (the notes and the passages) -> atomic items, one check each.

Items are built from the passages the prompt shows, so their content follows the evidence and is never invented.
"""

from __future__ import annotations

import random

from score_lightning import protocol as P
from score_lightning.retrieval.base import SearchHit
from score_lightning.rewards.report_edits import drop_citations
from score_lightning.rollout.agent import AgentConfig, format_observation
from score_lightning.rollout.chat import encode_chat
from score_lightning.methods.rler.items import ITEMS_CLOSE, ITEMS_OPEN, Item, contrast_messages, init_messages, parse_items
from score_lightning.methods.rler.research_prompts import (
    FINDINGS_CLOSE, FINDINGS_OPEN, distil_messages, observed_passages, research_messages,
)
from score_lightning.sft.context import DemoContext
from score_lightning.sft.demo_registry import DEMO_SOURCES, DemoSource, ExtraKind
from score_lightning.sft.demo_types import Demo, encode
from score_lightning.sft.solver_demos import answer_for, solver_plan, visible_evidence
from score_lightning.roles.text import first_sentence, query_entities, query_keywords

ITEMS_INIT, ITEMS_CONTRAST, RESEARCH, DISTIL = "items_init", "items_contrast", "research", "distil"
ITEM_KINDS = (ITEMS_INIT, ITEMS_CONTRAST, RESEARCH, DISTIL)

# The shapes the rubric sources use by default (EvolvingRubrics, DeepResearchRubrics): the demos follow them so that
# rler_tiny and drrubric_tiny share one cold start.
INIT_PASSAGES, PASSAGE_CHARS = 3, 300
RESEARCH_TURNS, RESEARCH_TOPK, RESEARCH_OBS_TOKENS, RESEARCH_TOKENS = 3, 3, 96, 384
DISTIL_PASSAGES, DISTIL_PASSAGE_CHARS, ITEM_TOKENS = 6, 200, 256


def _clause(sentence: str, words: int = 12) -> str:
    text = " ".join(sentence.split()[:words]).rstrip(".,;:")
    return text[:1].lower() + text[1:]


def query_names(ctx: DemoContext, query: str) -> list[str]:
    """What an item names: the query's entities, else its first keywords."""
    return query_entities(query, ctx.known_ids) or query_keywords(query)[:2] or ["the question"]


def item_count(n: int, evidence: list[tuple[str, str]]) -> int:
    """How many items :func:`evidence_items` writes when asked for ``n`` (the prompt asks for exactly these)."""
    return max(min(n, len(evidence) + 2), 2)


def evidence_items(rng: random.Random, names: list[str], evidence: list[tuple[str, str]], n: int) -> list[Item]:
    """``item_count(n)`` atomic items: one per shown passage (what it says, cited), a structure item, then a flaw."""
    name = rng.choice(names)
    pool = [Item(f"Reports what [{doc}] says: {_clause(s)}", rng.choice((0.3, 0.4, 0.5))) for doc, s in evidence]
    pool.append(Item(f"Ends with a one-sentence conclusion about {name}", rng.choice((0.1, 0.2))))
    flaw = Item(f"Makes a claim about {name} without citing a retrieved document", rng.choice((0.1, 0.2)), True)
    return [*pool[: max(n - 1, 1)], flaw][:n]


def items_text(items: list[Item]) -> str:
    """The items in the format :func:`~score_lightning.methods.rler.items.parse_items` reads."""
    sign = ' sign="-"'
    body = "".join(f'<item weight="{it.weight:.2f}"{sign if it.negative else ""}>{it.text}</item>' for it in items)
    return f"{ITEMS_OPEN}{body}{ITEMS_CLOSE}"


def shown_evidence(ctx: DemoContext, hits: list[SearchHit], budget: int) -> list[tuple[str, str]]:
    """(doc id, sentence) of each passage an observation of ``budget`` tokens shows."""
    return [(e.doc_id, e.sentence) for e in visible_evidence(ctx.tok, hits, budget)]


def _item_demos(ctx: DemoContext, kind: str, prompt: list[int], texts: list[str], meta: dict) -> list[Demo]:
    if len(prompt) > ctx.b.max_prompt_tokens:
        return []
    out = []
    for text in texts:
        ids = encode(ctx.tok, text)
        if not parse_items(text).items or len(ids) >= ITEM_TOKENS:
            continue
        out.append(Demo(kind, prompt, ids + [ctx.eos], [1] * (len(ids) + 1), meta=meta))
    return out


def init_group(ctx: DemoContext, rng: random.Random, query: str, n: int) -> list[Demo]:
    """RLER's first visit: the prompt :class:`~score_lightning.methods.rler.evolving.EvolvingRubrics` sends."""
    hits = ctx.retriever.search([query], INIT_PASSAGES)[0]
    evidence = [(h.id, s) for h in hits for s in [_first(h)] if s]
    if not evidence:
        return []
    k = item_count(rng.randint(2, 4), evidence)
    prompt = encode_chat(ctx.tok, init_messages(query, [f"[{h.id}] {h.text[:PASSAGE_CHARS]}" for h in hits], k))
    names = query_names(ctx, query)
    texts = [items_text(evidence_items(random.Random(rng.random()), names, evidence, k)) for _ in range(n)]
    return _item_demos(ctx, ITEMS_INIT, prompt, texts, {"query": query, "n_items": k})


def contrast_group(ctx: DemoContext, rng: random.Random, query: str, n: int) -> list[Demo]:
    """RLER's later visits: a cited best report against the same report without its citations."""
    qs, hits = solver_plan(ctx, rng, query, rng.randint(1, 2))
    best = answer_for(ctx, rng, query, hits, None, 2)
    if not best or "[" not in best:
        return []
    worst = drop_citations(best)
    names = query_names(ctx, query)
    evidence = [e for hs in hits for e in shown_evidence(ctx, hs, ctx.b.max_observation_tokens)]
    current = evidence_items(rng, names, evidence, rng.randint(2, 3)) if evidence else []
    passages = "\n".join(f"[{doc}] {s[:200]}" for doc, s in dict(evidence).items())
    k = rng.randint(1, 2)
    prompt = encode_chat(ctx.tok, contrast_messages(query, current, best, worst, k, passages, ""))
    name = rng.choice(names)
    fresh = [Item(f"Cites a retrieved document for every finding about {name}", 0.4),
             Item(f"States findings about {name} with no document cited", 0.3, True)]
    texts = [items_text(fresh[:k] if i % 2 == 0 else fresh[::-1][:k]) for i in range(n)]
    return _item_demos(ctx, ITEMS_CONTRAST, prompt, texts, {"query": query, "n_items": k})


def research_group(ctx: DemoContext, rng: random.Random, query: str, n: int) -> list[Demo]:
    """DR-rubric Stage I, through the agent loop with the source's default budgets."""
    agent = AgentConfig(max_tool_calls=RESEARCH_TURNS, max_response_tokens=RESEARCH_TOKENS,
                        max_observation_tokens=RESEARCH_OBS_TOKENS, topk=RESEARCH_TOPK, finish_tag=FINDINGS_CLOSE,
                        observations_in_budget=False)
    prompt = encode_chat(ctx.tok, research_messages(query))
    if len(prompt) > ctx.b.max_prompt_tokens:
        return []
    out = []
    for _ in range(n):
        sub = random.Random(rng.random())
        qs, hits = _research_plan(ctx, sub, query)
        evidence = list(dict(e for hs in hits for e in shown_evidence(ctx, hs, RESEARCH_OBS_TOKENS)).items())
        if not evidence:
            continue
        turns = [f"{P.SEARCH_OPEN}{q}{P.SEARCH_CLOSE}" for q in qs]
        turns.append(findings_for(sub, query_names(ctx, query), evidence))
        traj = ctx.script(turns, prompt, agent)
        if not traj.finished or traj.truncated:
            continue
        out.append(Demo(RESEARCH, prompt, traj.response_ids + [ctx.eos], traj.response_mask + [1],
                        meta={"query": query, "searches": len(qs)}))
    return out


def distil_group(ctx: DemoContext, rng: random.Random, query: str, n: int) -> list[Demo]:
    """DR-rubric Stage II: the notes and passages a research run gives, distilled into atomic items."""
    qs, hits = _research_plan(ctx, rng, query)
    evidence = list(dict(e for hs in hits for e in shown_evidence(ctx, hs, RESEARCH_OBS_TOKENS)).items())
    if not evidence:
        return []
    names = query_names(ctx, query)
    observed = "".join(ctx.tok.decode(format_observation(hs, RESEARCH_OBS_TOKENS, ctx.tok)[0]) for hs in hits)
    passages = observed_passages(observed, DISTIL_PASSAGES, DISTIL_PASSAGE_CHARS)
    findings = findings_for(rng, names, evidence)[len(FINDINGS_OPEN):-len(FINDINGS_CLOSE)]
    k = item_count(rng.randint(3, 5), evidence)
    prompt = encode_chat(ctx.tok, distil_messages(query, findings, passages, k))
    texts = [items_text(evidence_items(random.Random(rng.random()), names, evidence, k)) for _ in range(n)]
    return _item_demos(ctx, DISTIL, prompt, texts, {"query": query, "n_items": k})


def findings_for(rng: random.Random, names: list[str], evidence: list[tuple[str, str]]) -> str:
    """Stage I notes: the facts the searches showed (cited), the structure a report needs, the mistake to avoid."""
    name = rng.choice(names)
    facts = " ".join(f"[{doc}] {_clause(s)}." for doc, s in evidence[:3])
    return (f"{FINDINGS_OPEN}Facts: {facts} Structure: findings about {name}, each cited, then a conclusion. "
            f"Mistakes: claims about {name} with no citation.{FINDINGS_CLOSE}")


def _research_plan(ctx: DemoContext, rng: random.Random, query: str) -> tuple[list[str], list[list[SearchHit]]]:
    qs, _ = solver_plan(ctx, rng, query, rng.randint(1, RESEARCH_TURNS))
    return qs, ctx.retriever.search(qs, RESEARCH_TOPK)


def _first(hit: SearchHit) -> str:
    return first_sentence(hit.text[:PASSAGE_CHARS], 12)


def _key_fields(cfg, counts, on: bool) -> dict:
    """The item-writing counts in the SFT cache key (present, zeroed, while off: the packaged keys hold them)."""
    return {"num_items": int(counts["items"]) if on else 0, "items_per_prompt": int(counts["items_per_prompt"])}


def _kinds(fields) -> list[ExtraKind]:
    if fields["num_items"] <= 0:
        return []
    groups = ((ITEMS_INIT, init_group), (ITEMS_CONTRAST, contrast_group), (RESEARCH, research_group),
              (DISTIL, distil_group))
    return [ExtraKind(kind, fields["num_items"] // 2 if kind == ITEMS_CONTRAST else fields["num_items"],
                      fields["items_per_prompt"], group) for kind, group in groups]


#: the rubric sources whose writer writes <rubric_items> (rubric=evolving, rubric=drrubric) get all four kinds: one
#: source under both names, so rler_tiny and drrubric_tiny share one cold start; after the step judgements'
ITEM_DEMOS = DemoSource(2, {"items": 240, "items_per_prompt": 4}, _key_fields, _kinds)
for _writer in ("EvolvingRubrics", "DeepResearchRubrics"):
    DEMO_SOURCES["rubric"].register(_writer, ITEM_DEMOS)
