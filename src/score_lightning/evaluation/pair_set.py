"""A stored pair set (``scripts/bench_evaluator.py``): JSONL, one pair a line, and a manifest with its digest.

Each line is one :class:`~score_lightning.rewards.report_pairs.Pair`, keys sorted, compact::

    {"better": 0, "kind": "truncated", "query": "When should ...?", "query_id": "q003",
     "sides": [{"edit": "original", "grounded_valid": true, "item_recall": 0.333, "retrieved": ["..."],
                "sample": 2, "satisfied": 2, "source_query": "q003", "text": "... [a.b] ...", "words": 41},
               {"edit": "truncated", ...}]}

``better`` is the index of the side that is better by construction (the original of a degraded pair, the
side satisfying more evidence items of a valid pair). The manifest (``<file>.manifest.json``) holds the
``sha256:`` digest of the file's bytes, the counts and how the set was made (seed, model, sampling
settings, the items file's digest). Reading refuses a file whose bytes no longer match that digest, so two
scorings that print the same digest scored the same pairs.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from score_lightning.rewards.report_pairs import VALID, Pair, Side
from score_lightning.data.items import file_digest, text_digest

FORMAT = "score-lightning/evaluator-pairs/v1"


class PairSetError(ValueError):
    """A pair-set file that is missing, malformed, or no longer the file its manifest describes."""


def manifest_path(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.name.removesuffix(".jsonl") + ".manifest.json")


def pair_to_dict(pair: Pair) -> dict:
    return {"query_id": pair.query_id, "query": pair.query, "kind": pair.kind, "better": pair.better,
            "sides": [{"text": s.text, "retrieved": list(s.retrieved), "grounded_valid": s.grounded_valid,
                       "item_recall": s.item_recall, "satisfied": s.satisfied, "words": s.words, "edit": s.edit,
                       "source_query": s.source_query, "sample": s.sample} for s in pair.sides]}


def pair_from_dict(obj: dict) -> Pair:
    sides = tuple(Side(s["text"], tuple(s["retrieved"]), bool(s["grounded_valid"]), s["item_recall"],
                       int(s["satisfied"]), int(s["words"]), str(s["edit"]), str(s["source_query"]), int(s["sample"]))
                  for s in obj["sides"])
    if len(sides) != 2 or obj["better"] not in (0, 1):
        raise ValueError("a pair needs two sides and better = 0 or 1")
    return Pair(str(obj["query_id"]), str(obj["query"]), str(obj["kind"]), sides, int(obj["better"]))


def pairs_text(pairs: list[Pair]) -> str:
    """The file's text: one compact, key-sorted JSON line per pair (what the digest is taken over)."""
    return "".join(json.dumps(pair_to_dict(p), ensure_ascii=False, sort_keys=True, separators=(",", ":")) + "\n"
                   for p in pairs)


def counts(pairs: list[Pair]) -> dict:
    kinds = Counter(p.kind for p in pairs)
    return {"pairs": sum(v for k, v in kinds.items() if k != VALID), "valid_pairs": kinds.get(VALID, 0),
            "kinds": dict(sorted(kinds.items())), "queries": len({p.query_id for p in pairs})}


def write_pair_set(path: str | Path, pairs: list[Pair], meta: dict | None = None) -> str:
    """Write the pairs and their manifest; returns the digest."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = pairs_text(pairs)
    path.write_text(text, encoding="utf-8")
    digest = text_digest(text)
    manifest = {"format": FORMAT, "file": path.name, "digest": digest, **counts(pairs), **(meta or {})}
    manifest_path(path).write_text(json.dumps(manifest, indent=1, sort_keys=True, default=str) + "\n")
    return digest


def read_pair_set(path: str | Path) -> tuple[list[Pair], dict]:
    """The pairs and the manifest of a stored set, after checking the file against the manifest's digest."""
    path, mpath = Path(path), manifest_path(path)
    if not path.is_file():
        raise PairSetError(f"pair set not found: {path}")
    if not mpath.is_file():
        raise PairSetError(f"{path}: no manifest {mpath.name} beside it (the digest a stored pair set is checked "
                           "against); write pair sets with scripts/bench_evaluator.py")
    manifest = json.loads(mpath.read_text())
    if manifest.get("format") != FORMAT:
        raise PairSetError(f"{mpath}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    digest = file_digest(path)
    if digest != manifest.get("digest"):
        raise PairSetError(f"{path}: its bytes ({digest}) are not the pair set its manifest describes "
                           f"({manifest.get('digest')}): the file was changed after it was written")
    pairs = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            pairs.append(pair_from_dict(json.loads(line)))
        except (ValueError, KeyError, TypeError) as exc:
            raise PairSetError(f"{path}:{lineno}: not a pair ({exc})") from None
    return pairs, manifest
