"""The citation judge's prompt and the strict parser of its reply (``reward.citation_judge``).

One request per report (DR Tulu's single-pass citation scoring): the question, the report's claims numbered
1..n with the ids each cites, and the text of every cited passage as the solver's searches showed it. The
judge answers one JSON object::

    {"claims": [{"id": 1, "support": "full" | "partial" | "none",
                 "passages": {"<doc id>": "relevant" | "irrelevant", ...}},      # a claim that cites
                {"id": 2, "needs_citation": true | false}, ...]}                 # a claim that does not

Every claim must be answered, and every passage a claim cites: a reply that misses one is unusable (asked
again with the reason, then a failed judgement), never read as a partial score.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from score_lightning.clients.chat import ReplyError, extract_json_object
from score_lightning.methods.judge.citation_claims import SUPPORT, Claim, ClaimVerdict

CITATION_CHECK_SYSTEM = (
    "You check the citations of a research report, claim by claim. For each numbered claim you are given the "
    "ids of the passages it cites, and the text of those passages. Use only the passages, not your own "
    "knowledge.\n"
    "For a claim that cites passages: support is \"full\" if the cited passages together state or clearly imply "
    "the claim, \"partial\" if they support only part of it, \"none\" otherwise; and each cited passage is "
    "\"relevant\" if it supports some key point of the claim, else \"irrelevant\".\n"
    "For a claim without a citation: needs_citation is true if it states a fact that should be backed by a "
    "source, false for an opinion, a transition or a summary of cited claims.\n"
    "Reply with one JSON object and nothing else:\n"
    '{"claims": [{"id": 1, "support": "full", "passages": {"doc_id": "relevant"}}, '
    '{"id": 2, "needs_citation": false}]}'
)


def citation_check_messages(query: str, claims: Sequence[Claim], passages: Mapping[str, str]) -> list[dict[str, str]]:
    """System and user messages for one report's claims; ``passages``: the cited ids' texts."""
    lines = []
    for i, c in enumerate(claims, 1):
        cites = ", ".join(f"[{d}]" for d in c.cited) if c.cited else "no citation"
        lines.append(f"{i}. {c.text} (cites: {cites})")
    cited = list(dict.fromkeys(d for c in claims for d in c.cited))
    shown = "\n".join(f"[{d}] {passages.get(d) or '(this document was never retrieved)'}" for d in cited)
    user = (f"Question: {query.strip()}\n\nClaims:\n" + "\n".join(lines)
            + (f"\n\nPassages:\n{shown}" if cited else "\n\nNo claim cites a passage."))
    return [{"role": "system", "content": CITATION_CHECK_SYSTEM}, {"role": "user", "content": user}]


def _verdict(entry: Mapping, claim: Claim, i: int) -> ClaimVerdict:
    if not claim.cited:
        need = entry.get("needs_citation")
        if not isinstance(need, bool):
            raise ReplyError(f"claim {i}: needs_citation must be true or false, got {need!r}")
        return ClaimVerdict(needs_citation=need)
    support = str(entry.get("support", "")).strip().lower()
    if support not in SUPPORT:
        raise ReplyError(f"claim {i}: support must be one of {sorted(SUPPORT)}, got {entry.get('support')!r}")
    given = entry.get("passages")  # data, not config
    if not isinstance(given, Mapping):
        raise ReplyError(f"claim {i}: passages must be an object {{doc id: relevant | irrelevant}}")
    relevant = {}
    for d in claim.cited:
        value = str(given.get(d, given.get(f"[{d}]", ""))).strip().lower()
        if value not in ("relevant", "irrelevant"):
            raise ReplyError(f"claim {i}: passage [{d}] must be 'relevant' or 'irrelevant', got {given.get(d)!r}")
        relevant[d] = value == "relevant"
    return ClaimVerdict(support, relevant)


def citation_check_reader(claims: Sequence[Claim]):
    """A parser for :meth:`ChatClient.ask`: the reply's verdicts, one per claim, or :class:`ReplyError`."""

    def parse(text: str) -> list[ClaimVerdict]:
        obj = extract_json_object(text)
        entries = obj.get("claims")  # data, not config
        if not isinstance(entries, list):
            raise ReplyError('the reply needs "claims": a list with one object per claim')
        by_id = {}
        for e in entries:
            try:
                by_id[int(e.get("id"))] = e  # data, not config
            except (AttributeError, TypeError, ValueError):
                raise ReplyError(f"every claim entry needs an integer id, got {e!r}") from None
        missing = [i for i in range(1, len(claims) + 1) if i not in by_id]
        if missing:
            raise ReplyError(f"claims {missing} have no verdict: answer every claim 1..{len(claims)}")
        return [_verdict(by_id[i], c, i) for i, c in enumerate(claims, 1)]

    return parse
