"""Evidence items from an evidence tree, and queries synthesised from one (DeepRubric's last two steps).

**Items.** Each passage of the tree (:mod:`~score_lightning.evaluation.items.tree`) that is on the question's topic
(a part of its id or title is a word of the question), shallow and question-named passages first, becomes one atomic binary item: its leading sentence is the statement, its id the
evidence, and its ``terms`` the rarest content words of that sentence (rarest across the tree's passages,
never a word of its own id or title, so citing the id cannot state them). Passages off the question's
topic, and passages whose leading sentence has no such word (their item checks the citation alone), only
fill a query that would otherwise have fewer than ``min_items``.

**Queries.** From a seed topic alone, :func:`synthesise_query` builds the tree of "what does the corpus
document about <topic>?", names the first passages' titles in a question, and keeps the items of exactly
those passages: the reward then asks for exactly the information the query requests.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from score_lightning.data.items import EvidenceItem, QueryItems
from score_lightning.evaluation.items.tree import (
    EvidenceTree, build_tree, content_words, lead_sentence, tree_passage_order,
)
from score_lightning.retrieval.base import Retriever, SearchHit


def item_terms(hit: SearchHit, tree: EvidenceTree, n: int = 2) -> tuple[str, ...]:
    """Up to ``n`` content words of the passage's leading sentence, rarest in the tree first, lower-cased."""
    own = set(re.findall(r"[a-z]+", f"{hit.id} {hit.title}".lower()))
    words = [w.lower() for w in content_words(lead_sentence(hit)) if w.lower() not in own]
    words = list(dict.fromkeys(words))
    df = Counter(w for h in tree.hits.values() for w in {x.lower() for x in content_words(lead_sentence(h))})
    ranked = sorted(words, key=lambda w: (df[w], -len(w), words.index(w)))
    return tuple(ranked[:n])


def _name_words(text: str) -> set[str]:
    """Lower-cased name parts (``json.JSONDecoder.raw_decode`` -> json, jsondecoder, raw, decode)."""
    return {w for w in re.split(r"[^a-z0-9]+", text.lower()) if len(w) >= 2 and not w.isdigit()}


def on_topic(hit: SearchHit, question: str) -> bool:
    """A passage is evidence for the question when a part of its id or title is a word the question uses:
    a search for ``move_to_end`` that returns ``io.FileIO.seek`` found a neighbour, not evidence."""
    return bool(_name_words(f"{hit.id} {hit.title}") & _name_words(question))


def passage_item(hit: SearchHit, tree: EvidenceTree, depth: int, question: str) -> EvidenceItem:
    """The item one passage makes (``terms`` empty when its leading sentence has no word to check)."""
    sentence = lead_sentence(hit)
    terms = item_terms(hit, tree) if sentence else ()
    said = f': "{sentence}"' if sentence else ""
    checked = f" (key terms: {', '.join(terms)})" if terms else ""
    text = f"Cites {hit.id} for what it documents{said}{checked}"
    return EvidenceItem(text=text, evidence=(hit.id,), terms=terms, weight=1.0, depth=depth, question=question)


def tree_items(tree: EvidenceTree, max_items: int, min_items: int = 3) -> list[EvidenceItem]:
    """Up to ``max_items`` items in :func:`~score_lightning.evaluation.items.tree.tree_passage_order`: on-topic passages
    with terms; when fewer than ``min_items`` are, the rest (off-topic, then term-less) fill up to it."""
    where = tree.found_at()
    question = tree.nodes[0].question
    made = [(on_topic(tree.hits[pid], question), passage_item(tree.hits[pid], tree, tree.nodes[where[pid]].depth,
                                                             tree.nodes[where[pid]].question))
            for pid in tree_passage_order(tree)]
    out = [it for ok, it in made if ok and it.terms][:max_items]
    fill = [it for ok, it in made if not ok and it.terms] + [it for _, it in made if not it.terms]
    return out + fill[:max(0, min(min_items, max_items) - len(out))]


def query_items(qid: str, prompt: str, retriever: Retriever, known_ids: frozenset[str], *, depth: int = 2,
                branch: int = 3, topk: int = 2, max_items: int = 6, min_items: int = 3, extra: dict | None = None,
                keep_tree: bool = True) -> QueryItems:
    """An existing query's items from its own evidence tree."""
    tree = build_tree(prompt, retriever, known_ids, depth=depth, branch=branch, topk=topk)
    out = dict(extra or {})
    if keep_tree:
        out["tree"] = [n.to_dict() for n in tree.nodes]
    return QueryItems(qid, prompt, tree_items(tree, max_items, min_items), out)


def synthesise_query(topic: str, retriever: Retriever, known_ids: frozenset[str], *, depth: int = 2,
                     branch: int = 3, topk: int = 2, n_named: int = 3, qid: str | None = None,
                     keep_tree: bool = True) -> QueryItems | None:
    """A new query about ``topic`` and its items, or ``None`` when the tree holds too little to ask about."""
    root = f"What does the corpus document about {topic}?"
    tree = build_tree(root, retriever, known_ids, depth=depth, branch=branch, topk=topk, search=topic)
    items = tree_items(tree, max_items=n_named, min_items=0)
    if len(items) < 2:
        return None
    names = [tree.hits[it.evidence[0]].title or it.evidence[0] for it in items]
    listed = ", ".join(names[:-1]) + f" and {names[-1]}"
    prompt = (f"Explain {listed}: what each one does according to its documentation, how they differ, "
              f"and when a program about {topic} should use each.")
    slug = re.sub(r"[^a-z0-9]+", "-", topic.lower()).strip("-") or "topic"
    extra = {"split": "train", "topic": topic, "synthesised": True}
    if keep_tree:
        extra["tree"] = [n.to_dict() for n in tree.nodes]
    return QueryItems(qid or f"syn-{slug}", prompt, items, extra)


def build_item_set(queries: Sequence[tuple[str, str, dict]], retriever: Retriever, known_ids: frozenset[str],
                   topics: Sequence[str] = (), **tree_kw) -> list[QueryItems]:
    """Items for every ``(id, prompt, extra)`` query, then one synthesised query per topic (ids unique)."""
    out = [query_items(qid, prompt, retriever, known_ids, extra=extra, **tree_kw) for qid, prompt, extra in queries]
    seen = {q.id for q in out}
    syn_kw = {k: v for k, v in tree_kw.items() if k not in ("max_items", "min_items")}
    for topic in topics:
        q = synthesise_query(topic, retriever, known_ids, **syn_kw)
        if q is not None and q.id not in seen:
            seen.add(q.id)
            out.append(q)
    return out
