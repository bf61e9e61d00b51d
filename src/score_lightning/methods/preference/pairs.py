"""The packaged preference pairs (``evaluator.reward=preference``): built from the embedded queries' evidence items,
ordered by verifiable ``item_recall``, with an 8:1:1 split by question.

For every training query of the items file (``split: train``; the embedded set's 40, so no held-out query of the
solver's card ever enters a pair), :func:`build_pairs` writes two pairs of short research reports on the question.
Both reports of a pair have the same shape (an overview, one cited sentence per finding, a conclusion) and cite the
same passages; they differ in whether each finding states what its passage documents:

* a finding that **states** item j quotes what the item's passage documents and cites it, so it satisfies the item
  under the programmatic verifier (:mod:`score_lightning.rewards.items`: cited, retrieved, its terms stated);
* a finding that **does not** names the same passage with a vague sentence and no key term.

Pair 1: the chosen report states items 1 and 2, the rejected one none. Pair 2: the chosen report states items 1-3,
the rejected one item 1 only. ``chosen_recall`` and ``rejected_recall`` are what the verifier measures (a stated
item can satisfy another that shares its passage and words); a pair whose chosen report does not satisfy more items
is left out. So the chosen report satisfies more of its question's items, verifiably, and length or citation count
cannot tell the two apart.

The split is by question (seeded shuffle of the query ids): 32 questions train, 4 val, 4 test, so a held-out pair
never shares its question with a training pair. Deterministic: ``scripts/build_preferences.py`` writes the file and
a manifest with its digest; a test rebuilds it and compares.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence

from score_lightning.data.items import EvidenceItem, QueryItems

SPLIT_SEED = 0
SPLIT_SHARES = (("train", 8), ("val", 1), ("test", 1))
#: the splits training never draws (``rubrics.preference`` trains on ``train`` only)
HELD_OUT = ("val", "test")
_QUOTE = re.compile(r'"(.+?)"\s*\(key terms')


def statement(item: EvidenceItem) -> str:
    """A sentence that satisfies the item: what its passage documents, quoted, with the passage cited."""
    doc = item.evidence[0]
    m = _QUOTE.search(item.text)
    quote = m.group(1).strip().rstrip(".") if m else " ".join(item.terms)
    return f'{doc} is documented as "{quote}" [{doc}].'


def vague(item: EvidenceItem) -> str:
    """The same passage named and cited, without what it documents (none of the item's terms)."""
    doc = item.evidence[0]
    return f"{doc} is relevant to this question [{doc}]."


def report(question: str, items: Sequence[EvidenceItem], stated: int) -> str:
    """A short research report with one finding per item: the first ``stated`` state their items, the rest are vague."""
    findings = " ".join(statement(it) if j < stated else vague(it) for j, it in enumerate(items))
    subject = question.strip().rstrip("?").split(":")[0]
    return (f"This report answers the question from the documentation. {findings}\n\n"
            f"Conclusion: the cited documentation answers {subject[:80].lower()}.")


def split_of(query_ids: Sequence[str], seed: int = SPLIT_SEED) -> dict[str, str]:
    """8:1:1 over the questions (seeded shuffle of the sorted ids): each question's split."""
    ids = sorted(query_ids)
    random.Random(seed).shuffle(ids)
    total = sum(w for _, w in SPLIT_SHARES)
    n_val = n_test = max(1, round(len(ids) / total))
    cut = {"test": ids[:n_test], "val": ids[n_test:n_test + n_val]}
    return {q: next((s for s, qs in cut.items() if q in qs), "train") for q in ids}


def build_pairs(queries: Sequence[QueryItems]) -> list[dict]:
    """Two pairs per training query with at least three items (module docstring), in query-id order."""
    usable = [q for q in queries if q.extra.get("split", "train") == "train" and len(q.items) >= 3]  # data, not config
    splits = split_of([q.id for q in usable])
    out = []
    for q in sorted(usable, key=lambda q: q.id):
        for k, (items, good, bad) in enumerate(((q.items[:2], 2, 0), (q.items[:3], 3, 1)), 1):
            chosen, rejected = report(q.prompt, items, good), report(q.prompt, items, bad)
            recall = [verified_recall(q.items, text) for text in (chosen, rejected)]
            if recall[0] <= recall[1]:  # items that share a passage and its words: no verifiable order
                continue
            out.append({"id": f"{q.id}-{k}", "query_id": q.id, "prompt": q.prompt, "split": splits[q.id],
                        "chosen": chosen, "rejected": rejected,
                        "chosen_recall": round(recall[0], 4), "rejected_recall": round(recall[1], 4)})
    return out


def verified_recall(items: Sequence[EvidenceItem], text: str) -> float:
    """``item_recall`` of a report by the programmatic verifier, its cited passages taken as retrieved."""
    from score_lightning.rewards.citations import cited_ids
    from score_lightning.rewards.items import item_recall

    return float(item_recall(items, text, cited_ids(text), True) or 0.0)


def pairs_text(pairs: Sequence[dict]) -> str:
    """The file's text: one compact, key-sorted JSON line per pair (what the digest is taken over)."""
    return "".join(json.dumps(p, ensure_ascii=False, sort_keys=True, separators=(",", ":")) + "\n" for p in pairs)


def as_pair_set(pairs: Sequence[dict], items: dict[str, QueryItems], split: str) -> list:
    """The ``split`` pairs (``heldout``: ``val`` and ``test`` together, the pairs no training step draws) as ``scripts/bench_evaluator.py`` pairs (kind ``valid``, the chosen side better, sides
    alternating), so the benchmark measures a rubric writer on held-out preference pairs: pairwise accuracy, AUC and
    Cohen's d with query-bootstrap intervals, the metrics preference-trained rubric generators report."""
    from score_lightning.rewards.citations import cited_ids
    from score_lightning.rewards.report_pairs import VALID, Pair, Side

    wanted = HELD_OUT if split == "heldout" else (split,)
    out = []
    for i, p in enumerate(x for x in pairs if x["split"] in wanted):
        n = len(items[p["query_id"]].items)

        def side(text: str, recall: float) -> Side:
            return Side(text, tuple(cited_ids(text)), True, recall, round(recall * n), len(text.split()),
                        source_query=p["query_id"])

        sides = (side(p["chosen"], p["chosen_recall"]), side(p["rejected"], p["rejected_recall"]))
        better = i % 2
        out.append(Pair(p["query_id"], p["prompt"], VALID, sides if better == 0 else sides[::-1], better))
    return out
