"""An evidence tree per question (DeepRubric): sub-questions expanded recursively, each answered by retrieval.

The root is the question itself, answered by its top passages (D_q^0). Its children are the sub-questions
the question names: one per entity it mentions (``concurrent.futures.ThreadPoolExecutor``, ``heapq``),
then its keyword phrases, ``branch`` in all. Each retrieved passage then opens a deeper sub-question that pairs the passage's
title with a term of its own leading sentence, until ``depth``. A passage enters the tree once, at the
shallowest node that found it; a node whose search finds nothing new is a leaf with no passages.

Programmatic and deterministic: the same corpus, retriever and question give the same tree. Only the
:class:`~score_lightning.retrieval.base.Retriever` protocol is used, so a JSONL corpus under BM25 and a
``/retrieve`` server both work.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from score_lightning.retrieval.base import Retriever, SearchHit
from score_lightning.roles.text import STOPWORDS, first_sentence, query_entities, query_keywords

#: words that never become a term or a sub-question keyword (besides the question stoplist of sft.text)
_WEAK = frozenset("""return returns object objects value values given default none true false instance class
function method module type used uses also which this that with from when into same other each more than
only such their there these those then them will shall should would could must where while about after""".split())


@dataclass
class EvidenceNode:
    """One sub-question, the search string that answered it and the passages it added to the tree."""

    question: str
    search: str
    depth: int
    parent: int | None
    passages: list[str] = field(default_factory=list)
    children: list[int] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"question": self.question, "search": self.search, "depth": self.depth, "parent": self.parent,
                "passages": list(self.passages)}


@dataclass
class EvidenceTree:
    """The nodes (index 0 is the root) and every passage they retrieved, by id."""

    nodes: list[EvidenceNode]
    hits: dict[str, SearchHit]

    def found_at(self) -> dict[str, int]:
        """Each passage id and the index of the node that added it."""
        return {pid: i for i, n in enumerate(self.nodes) for pid in n.passages}


def content_words(text: str) -> list[str]:
    """Alphabetic words of ``text`` worth stating (4+ letters, not a stopword), in order, unique."""
    words = [w.strip(".,;:()'\"") for w in text.split()]
    keep = [w for w in words if w.isalpha() and len(w) >= 4 and w.lower() not in _WEAK and w.lower() not in STOPWORDS]
    return list(dict.fromkeys(keep))


def lead_sentence(hit: SearchHit) -> str:
    """The passage's leading sentence as the cold-start demonstrations cite it (first ten words)."""
    return first_sentence(hit.text)


def _children(question: str, known_ids: frozenset[str], branch: int) -> list[tuple[str, str]]:
    """(sub-question, search string) pairs the root question names: its entities, then its keyword phrases."""
    out = [(f"What does the documentation say about {e}?", e) for e in query_entities(question, known_ids)]
    kws = query_keywords(question)
    for i in range(0, len(kws), 2):
        if len(out) >= branch:
            break
        phrase = " ".join(kws[i:i + 2])
        out.append((f"What does the corpus say about {phrase}?", phrase))
    return out[:branch]


def _deeper(hit: SearchHit) -> tuple[str, str] | None:
    """The sub-question a passage opens: its title with a term of its leading sentence."""
    title = hit.title or hit.id
    words = [w for w in content_words(lead_sentence(hit)) if w.lower() not in title.lower()]
    if not words:
        return None
    return f"How does {title} relate to {words[0].lower()}?", f"{title} {words[0].lower()}"


def build_tree(question: str, retriever: Retriever, known_ids: frozenset[str] = frozenset(), depth: int = 2,
               branch: int = 3, topk: int = 2, search: str | None = None) -> EvidenceTree:
    """The evidence tree of ``question`` (module docstring): breadth first, ``branch`` children per node.

    ``search``: what the root searches for and names its sub-questions from (default: the question itself;
    a seed topic when the question is a template around it)."""
    if depth < 1 or branch < 1 or topk < 1:
        raise ValueError(f"depth, branch and topk must be >= 1, got {depth}, {branch}, {topk}")
    root = question if search is None else search
    nodes = [EvidenceNode(question, root, 0, None)]
    hits: dict[str, SearchHit] = {}
    frontier = [0]
    while frontier:
        searches = [nodes[i].search for i in frontier]
        for i, found in zip(frontier, retriever.search(searches, topk)):
            for h in found:
                if h.id not in hits:
                    hits[h.id] = h
                    nodes[i].passages.append(h.id)
        nxt: list[int] = []
        for i in frontier:
            node = nodes[i]
            if node.depth >= depth:
                continue
            if node.depth == 0:
                subs = _children(root, known_ids, branch)
            else:
                subs = [s for s in (_deeper(hits[p]) for p in node.passages) if s is not None][:branch]
            for q, search in subs:
                nodes.append(EvidenceNode(q, search, node.depth + 1, i))
                node.children.append(len(nodes) - 1)
                nxt.append(len(nodes) - 1)
        frontier = nxt
    return EvidenceTree(nodes, hits)


def tree_passage_order(tree: EvidenceTree) -> list[str]:
    """Passage ids in the order items are taken: each depth-1 node's best passage, then the root's (D_q^0),
    then the other depth-1 passages, then deeper ones (shallow and question-named evidence first)."""
    first = [n.passages[0] for n in tree.nodes if n.depth == 1 and n.passages]
    root = list(tree.nodes[0].passages)
    rest = [p for n in tree.nodes if n.depth == 1 for p in n.passages[1:]]
    deep = [p for n in tree.nodes if n.depth >= 2 for p in n.passages]
    return list(dict.fromkeys([*first, *root, *rest, *deep]))
