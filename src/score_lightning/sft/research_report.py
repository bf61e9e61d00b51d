"""Research-report answers for the cold start (``sft.report``): what a solver demo writes when the
reports must be long enough to differ in quality.

A report has an overview, several findings each taken from a retrieved passage and cited with its
id, a synthesis citing two of the passages together, the lines the rubric asks for (practical
guidance, uncertainty) and a final ``Conclusion:`` line. Findings go round the passages (each
passage's first sentence, then their second ones), so a report of four findings from two passages
cites both twice with different sentences: item-level quality (which passages, which terms) varies
between reports of the same query, which a one-sentence answer cannot show.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from score_lightning.roles.rubric import Rubric
from score_lightning.roles.text import lower_first, query_entities, query_keywords

#: the words a finding's sentence may take from its passage (the short answers take 10)
REPORT_SENTENCE_WORDS = 20


def round_robin_findings(passages: Sequence[tuple[str, Sequence[str]]], n: int) -> list[tuple[str, str]]:
    """The first ``n`` (doc id, sentence) findings: every passage's first sentence, then every second one."""
    out: list[tuple[str, str]] = []
    depth = max((len(s) for _, s in passages), default=0)
    for level in range(depth):
        for doc_id, sentences in passages:
            if level < len(sentences) and len(out) < n:
                out.append((doc_id, sentences[level]))
    return out


def _finding(rng: random.Random, style: str, doc_id: str, sentence: str) -> str:
    s = sentence.rstrip(".")
    if style == "bullets":
        return f"- {s} [{doc_id}]."
    return rng.choice((f"{s} [{doc_id}].", f"According to [{doc_id}], {lower_first(s)}.",
                       f"The documentation of {doc_id} states that {lower_first(s)} [{doc_id}]."))


def build_report(rng: random.Random, query: str, passages: Sequence[tuple[str, Sequence[str]]], rubric: Rubric | None,
                 known_ids: frozenset[str], n_findings: int) -> str:
    """A report citing ``passages`` (doc id and its usable sentences, in search order) with ``n_findings`` findings."""
    ents = query_entities(query, known_ids) or query_keywords(query)[:2] or ["the question"]
    findings = round_robin_findings(passages, max(1, n_findings))
    if not findings:
        return ""
    docs = list(dict.fromkeys(d for d, _ in findings))
    dims = set(rubric.dims) if rubric else set()
    style = rng.choice(("sections", "prose", "bullets"))
    subject = f"{ents[0]} and {ents[1]}" if len(ents) >= 2 else ents[0]
    overview = rng.choice((f"This report covers {subject}, from {len(docs)} retrieved documents.",
                           f"The question is about {subject}; the findings below come from the retrieved documentation.",
                           f"This report answers the question on {subject} from the documents the searches returned."))
    body = [_finding(rng, style, d, s) for d, s in findings]
    analysis: list[str] = []
    if len(docs) >= 2:
        analysis.append(rng.choice((f"Taken together, [{docs[0]}] and [{docs[1]}] cover different sides of {ents[0]}.",
                                    f"Read side by side, [{docs[0]}] and [{docs[1]}] agree on how {ents[0]} is used.")))
    if "practical_guidance" in dims and rng.random() < 0.7:
        analysis.append(f"In practice, start with {docs[0]} and check its documentation for the details.")
    if "uncertainty_calibration" in dims and rng.random() < 0.7:
        missing = [e for e in ents if not any(e in d for d in docs)]
        if missing:
            analysis.append(f"The retrieved passages say little about {missing[0]}, so that part is less certain.")
    main = docs[0]
    concl = rng.choice((f"Conclusion: {main} is the most relevant choice here.", f"Conclusion: use {main} for this task.",
                        f"Conclusion: {lower_first(findings[0][1])}",
                        f"Conclusion: prefer {main}, as the cited documentation shows."))
    if style == "sections":
        parts = [f"Overview: {overview}", "Findings:", *(f"- {b.lstrip('- ')}" for b in body)]
        if analysis:
            parts.append("Analysis: " + " ".join(analysis))
    elif style == "bullets":
        parts = [overview, *body, *([" ".join(analysis)] if analysis else [])]
    else:
        parts = [" ".join([overview, *body]), *([" ".join(analysis)] if analysis else [])]
    return "\n".join(parts) + f"\n{concl}"
