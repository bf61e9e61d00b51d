"""Claims of a report and DR Tulu's claim-level citation scores (pure functions).

A report is split into statements (sentences; a piece made only of citation markers joins the sentence
before it). For the citation reward (``reward.citation_judge``, judged in ``methods/judge/citation.py``), each
statement is a claim with the ids it cites. DR Tulu's per-claim scores (its open-instruct
``citation_utils``):

* a cited claim: **recall** 1 / 0.5 / 0 when its passages together support it fully / partly / not at all,
  **precision** the share of its cited passages that support some key point of it (a cited id the trajectory
  never retrieved has no passage: it counts as not supporting, without asking);
* a claim without a citation: recall 0 when it states something that needs a source, else 1; precision 1;
* F1 = 2PR / (P + R), and the report's citation score is the mean F1 over its claims.

DR Tulu adds 0.4 x the share of cited ids that exist in its snippet ledger; here that is what validity
already requires under ``reward.citations=retrieved`` (every cited id among the retrieved ones), so the term
is the claim F1 alone.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from score_lightning.rewards.citations import cited_ids, strip_citations

_SENTENCE_RE = re.compile(r"(?<=[.!?])\s+")
SUPPORT = {"full": 1.0, "partial": 0.5, "none": 0.0}


def split_statements(article: str, known_ids: Collection[str] | None = None) -> list[str]:
    """Sentences of the article (split at line breaks and sentence ends); a piece made only of
    citation markers (``Claim. [a] [b]``) is joined to the sentence before it. ``known_ids``: the
    sources' retrieved ids, which resolve a bracket attached to a word (``rewards/citations.py``)."""
    pieces: list[str] = []
    for block in re.split(r"\n+", article or ""):
        for sent in _SENTENCE_RE.split(block.strip()):
            sent = sent.strip()
            if not sent:
                continue
            if pieces and cited_ids(sent, known_ids) and not strip_citations(sent, known_ids).strip(" .,;:!?-*"):
                pieces[-1] = f"{pieces[-1]} {sent}"
            else:
                pieces.append(sent)
    return pieces


def cited_statements(article: str, known_ids: Collection[str] | None = None) -> list[tuple[str, str]]:
    """Distinct ``(statement, doc_id)`` pairs, in order of appearance."""
    pairs: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for sent in split_statements(article, known_ids):
        for doc_id in cited_ids(sent, known_ids):
            if (sent, doc_id) not in seen:
                seen.add((sent, doc_id))
                pairs.append((sent, doc_id))
    return pairs


@dataclass(frozen=True)
class Claim:
    text: str  # the statement, citation markers removed
    cited: tuple[str, ...]  # the ids it cites, in order, distinct


def report_claims(report: str, known_ids: Collection[str] | None = None, max_claims: int | None = None) -> list[Claim]:
    """The report's claims in order (the first ``max_claims``); a conclusion line is a claim too."""
    out = []
    for sent in split_statements(report, known_ids):
        text = strip_citations(sent, known_ids).strip()
        if not text.strip(" .,;:!?-*"):
            continue
        out.append(Claim(text, tuple(dict.fromkeys(cited_ids(sent, known_ids)))))
    return out[:max_claims] if max_claims is not None else out


@dataclass(frozen=True)
class ClaimVerdict:
    """The judge's reading of one claim: ``support`` (full | partial | none) and each cited passage's
    relevance for a cited claim; ``needs_citation`` for an uncited one."""

    support: str = "none"
    relevant: Mapping[str, bool] | None = None
    needs_citation: bool = False


def claim_scores(claim: Claim, verdict: ClaimVerdict, retrieved: Collection[str]) -> tuple[float, float, float]:
    """(precision, recall, F1) of one claim."""
    if not claim.cited:
        precision, recall = 1.0, 0.0 if verdict.needs_citation else 1.0
    else:
        recall = SUPPORT[verdict.support]
        relevant = verdict.relevant or {}
        precision = sum(bool(relevant.get(d)) and d in retrieved for d in claim.cited) / len(claim.cited)
    f1 = 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)
    return precision, recall, f1


def citation_score(claims: Sequence[Claim], verdicts: Sequence[ClaimVerdict],
                   retrieved: Collection[str]) -> tuple[float, float, float]:
    """The report's mean (precision, recall, F1) over its claims; (0, 0, 0) for a report without claims."""
    if not claims:
        return 0.0, 0.0, 0.0
    scores = [claim_scores(c, v, retrieved) for c, v in zip(claims, verdicts)]
    return tuple(sum(s[i] for s in scores) / len(scores) for i in range(3))  # type: ignore[return-value]
