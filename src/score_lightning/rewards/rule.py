"""The known-good reward (``reward.source=rule``): a documented program of the trajectory and the corpus,
no evaluator.

R_rule(r) = a(r) · (1 + q(r)), with a(r) the report's validity under ``reward.citations`` (with
``retrieved``: closed, cited, every citation among the ids its searches showed it) and q(r) in [0, 1]
a programmatic quality, ``reward.rule_quality``:

* ``retrieved_cited`` (default): the share of the distinct documents the trajectory's searches showed it
  that the report cites. A report that reads three passages and grounds its claims in all three scores
  above one that cites one of them; citing what it never read already makes a(r) = 0.
* ``coverage``: the share of the query's top BM25 passages (the step's initial evidence D_q^0) that the
  report cites: finding and using the passages the corpus ranks best for the question.
* ``item_recall``: the share of the query's evidence items (``reward.items_path``, default the embedded
  queries' items from ``scripts/build_rubrics.py``) the report satisfies: cited, retrieved and stated
  (:mod:`score_lightning.rewards.items`). Coverage of what the question asks, passage by passage.
* ``none``: q = 0, so R = a(r).

Why this arm exists: it separates the trainer's update from the evaluator's competence. If RL cannot
raise held-out grounded validity under this reward, the fault is in the update, not in the judge.
It is not DR Tulu's citation reward, which judges each claim's support by its cited passages
(``reward.citation_judge``, STEP.md); it only checks that cited ids were retrieved. The same q is the programmatic
quality ``scripts/probe_scoring.py`` ranks the evaluator's scores against.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

from score_lightning.rewards.items import ItemLike, satisfied_items

QUALITIES = ("retrieved_cited", "coverage", "item_recall", "none")


def rule_quality(kind: str, cited: Sequence[str], retrieved: Iterable[str], top_ids: Iterable[str] = (), *,
                 report: str = "", items: Sequence[ItemLike] = ()) -> float:
    """q(r) in [0, 1] of one report (see the module docstring); 0 when what it divides by is empty.

    ``report`` and ``items`` (the query's evidence items) are read by ``item_recall`` only."""
    if kind not in QUALITIES:
        raise ValueError(f"reward.rule_quality={kind!r}: allowed {QUALITIES}")
    if kind == "none":
        return 0.0
    if kind == "item_recall":
        verdicts = satisfied_items(items, report, retrieved)
        return sum(verdicts) / len(verdicts) if verdicts else 0.0
    cites = set(cited)
    pool = list(dict.fromkeys(retrieved if kind == "retrieved_cited" else top_ids))
    return sum(d in cites for d in pool) / len(pool) if pool else 0.0


def rule_rewards(validity: Tensor, quality: Tensor) -> Tensor:
    """R = a(r) · (1 + q(r)) per report: a(r) in {0, 1} (or a score), q in [0, 1]."""
    if validity.shape != quality.shape:
        raise ValueError(f"validity {tuple(validity.shape)} and quality {tuple(quality.shape)} differ in shape")
    return validity.float() * (1.0 + quality.float().clamp(0.0, 1.0))


def qualities(kind: str, cited: Sequence[Sequence[str]], retrieved: Sequence[Iterable[str]],
              top_ids: Sequence[Iterable[str]] | None = None, reports: Sequence[str] | None = None,
              items: Sequence[Sequence[ItemLike]] | None = None) -> Tensor:
    """q(r) of every report, as a tensor (``top_ids``: each report's query's D_q^0 ids, for ``coverage``;
    ``reports`` and ``items``: each report's text and its query's items, for ``item_recall``)."""
    n = len(cited)
    tops = top_ids if top_ids is not None else [()] * n
    texts = reports if reports is not None else [""] * n
    its = items if items is not None else [()] * n
    return torch.tensor([rule_quality(kind, c, r, t, report=x, items=i)
                         for c, r, t, x, i in zip(cited, retrieved, tops, texts, its)], dtype=torch.float32)
