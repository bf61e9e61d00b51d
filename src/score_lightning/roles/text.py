"""Text heuristics over a question and retrieved passages: the names a question is about, search
strings derived from it, and clean leading sentences to cite.

Solver answers, scoring verifications and gap analyses all read the question the same way, so
these helpers live apart from any one demo kind.
"""

from __future__ import annotations

import random
import re

_DOTTED_RE = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
_WORD_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_STOP = frozenset(
    """a an the and or of for to in on with without by from as at is are be been was were do does did how
    what which when where why who whom should would could can may might must will shall it its this that these
    those each every any all both either between versus vs than then there their they them you your we our
    explain compare describe cover given also not no yes into over under about plain new use used using
    differ difference differences work works working when what's does help helps make makes
    """.split()
)
#: the question stoplist, shared with the evidence-item builder (score_lightning.evaluation.items)
STOPWORDS = _STOP
_SENT_SPLIT_RE = re.compile(r"(?<=[.!?])\s+|\n+")


def _clean(text: str) -> str:
    """Passage text made safe inside an answer: no brackets (not a citation), no angle tags, one line."""
    text = text.replace("[", "(").replace("]", ")").replace("<", "").replace(">", "")
    text = text.replace("`", "").replace("*", "")
    return re.sub(r"\s+", " ", text).strip()


def _words_cap(text: str, n: int) -> str:
    words = text.split()
    return text if len(words) <= n else " ".join(words[:n])


def query_entities(query: str, known_ids: frozenset[str] = frozenset()) -> list[str]:
    """Names the question is about: dotted names, snake/CamelCase identifiers, known module ids."""
    out: list[str] = []
    for m in _DOTTED_RE.findall(query):
        out.append(m.rstrip("."))
    for w in _WORD_RE.findall(query):
        if any(w in o.split(".") for o in out):
            continue
        is_ident = "_" in w.strip("_") or (any(c.isupper() for c in w[1:]) and any(c.islower() for c in w))
        if is_ident or (w in known_ids and w.lower() not in _STOP and len(w) > 2):
            out.append(w)
    return list(dict.fromkeys(out))


def query_keywords(query: str) -> list[str]:
    """Content words of the question, in order, without stopwords and duplicates."""
    words = [w for w in _WORD_RE.findall(query.replace(".", " ")) if w.lower() not in _STOP and len(w) > 2]
    return list(dict.fromkeys(words))


def search_queries(rng: random.Random, query: str, n: int, known_ids: frozenset[str]) -> list[str]:
    """``n`` distinct search strings derived from the question (names, name + keyword, keywords)."""
    ents = query_entities(query, known_ids)
    kws = [k for k in query_keywords(query) if not any(k in e for e in ents)]
    cands: list[str] = []
    order = ents[:]
    rng.shuffle(order)
    for e in order:
        r = rng.random()
        if r < 0.6 or not kws:
            cands.append(e)
        else:
            cands.append(f"{e} {rng.choice(kws)}")
    if kws:
        for _ in range(2):
            k = min(len(kws), rng.randint(2, 3))
            start = rng.randrange(0, max(1, len(kws) - k + 1))
            cands.append(" ".join(kws[start : start + k]))
    cands = list(dict.fromkeys(c for c in cands if c.strip()))
    # names first (more specific), keyword phrases fill in; keep some randomness in which names
    return cands[:n] if len(cands) >= n else cands


def first_sentence(text: str, max_words: int = 10) -> str:
    """A readable leading sentence of a passage (skipping code-like lines), cleaned and capped."""
    found = passage_sentences(text, 1, max_words)
    return found[0] if found else ""


def passage_sentences(text: str, n: int, max_words: int = 10) -> list[str]:
    """Up to ``n`` readable sentences of a passage in order (code-like lines skipped), cleaned and capped."""
    out: list[str] = []
    for s in _SENT_SPLIT_RE.split(text):
        s = _clean(s)
        letters = sum(c.isalpha() for c in s)
        if len(s.split()) >= 3 and letters >= 0.6 * max(len(s), 1) and "import " not in s and ">>>" not in s:
            s = _words_cap(s, max_words).rstrip(" .,:;")
            out.append(s[0].upper() + s[1:] + ".")
            if len(out) >= n:
                break
    return out


def lower_first(s: str) -> str:
    """``s`` with its first letter lowered, unless it starts an acronym."""
    return s[:1].lower() + s[1:] if s[:1].isupper() and not s[1:2].isupper() else s
