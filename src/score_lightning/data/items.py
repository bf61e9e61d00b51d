"""The evidence-items file: queries with their binary, evidence-backed rubric items, one JSON line each.

One line per query, a superset of the binary-checklist format ``rubric=given`` loads (so the same file is
a query file, a given-rubric file and the items the verifier reads)::

    {"id": "q003", "prompt": "When should a program use ...?", "split": "heldout", "topic": "concurrency",
     "rubrics": [{"text": "States, citing concurrent.futures.ProcessPoolExecutor, that it initializes a new
                   ProcessPoolExecutor instance.", "weight": 1.0, "type": "binary",
                  "evidence": ["concurrent.futures.ProcessPoolExecutor"], "terms": ["initializes", "instance"],
                  "depth": 1, "question": "What does the documentation say about ProcessPoolExecutor?"}],
     "tree": [{"question": "...", "search": "...", "depth": 0, "parent": null, "passages": ["..."]}, ...]}

* ``text``, ``weight``, ``type``: the checklist fields (DRB-II, DeepRubric); any judge can read ``text``.
* ``evidence``: the corpus ids of the passages that support the statement; ``terms``: the words a report
  must state (each a whole word, case-insensitive). The programmatic verifier
  (:mod:`score_lightning.rewards.items`) reads only these two.
* ``depth`` and ``question``: where in the evidence tree the item's passage was found; ``tree``: the whole
  tree (optional; provenance only).

Other fields of a line (``split``, ``topic``, ...) are kept, as :func:`~score_lightning.data.queries.load_queries`
keeps them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from score_lightning.data.corpus import DataFormatError, iter_jsonl

#: the embedded queries' items (``scripts/build_rubrics.py``; its manifest beside it)
EMBEDDED_ITEMS_PATH: Path = Path(__file__).resolve().parents[1] / "data" / "assets" / "items.jsonl"
EMBEDDED_ITEMS_MANIFEST: Path = EMBEDDED_ITEMS_PATH.with_suffix(".manifest.json")


@dataclass(frozen=True)
class EvidenceItem:
    """One atomic, verifiable statement a report on the query should make."""

    text: str
    evidence: tuple[str, ...]
    terms: tuple[str, ...]
    weight: float = 1.0
    depth: int = 0
    question: str = ""

    def to_dict(self) -> dict:
        return {"text": self.text, "weight": self.weight, "type": "binary", "evidence": list(self.evidence),
                "terms": list(self.terms), "depth": self.depth, "question": self.question}


@dataclass
class QueryItems:
    """A query line of the items file."""

    id: str
    prompt: str
    items: list[EvidenceItem]
    extra: dict = field(default_factory=dict)  # split, topic, tree, ...

    def to_dict(self) -> dict:
        return {"id": self.id, "prompt": self.prompt, **{k: v for k, v in self.extra.items() if k != "tree"},
                "rubrics": [it.to_dict() for it in self.items],
                **({"tree": self.extra["tree"]} if "tree" in self.extra else {})}


def _strings(value, path: Path, lineno: int, what: str, allow_empty: bool = False) -> tuple[str, ...]:
    if not isinstance(value, list) or (not value and not allow_empty) or not all(
            isinstance(v, str) and v.strip() for v in value):
        raise DataFormatError(path, lineno, f"{what} must be a {'' if allow_empty else 'non-empty '}list of "
                                            f"non-empty strings, got {value!r:.80}")
    return tuple(v.strip() for v in value)


def _item(obj, path: Path, lineno: int, j: int) -> EvidenceItem:
    text = obj.get("text") if isinstance(obj, dict) else None  # data, not config
    if not isinstance(text, str) or not text.strip():
        raise DataFormatError(path, lineno, f'rubrics[{j}] needs a non-empty "text"')
    if "evidence" not in obj:
        raise DataFormatError(path, lineno, f'rubrics[{j}] has no "evidence" (the ids that support it): an evidence '
                                            "item needs one; a plain checklist loads with rubric=given instead")
    weight = obj.get("weight", 1.0)  # data, not config
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
        raise DataFormatError(path, lineno, f"rubrics[{j}].weight must be a positive number, got {weight!r}")
    if obj.get("type", "binary") != "binary":
        raise DataFormatError(path, lineno, f'rubrics[{j}].type must be "binary" for an evidence item')
    return EvidenceItem(text=" ".join(obj["text"].split()), evidence=_strings(obj["evidence"], path, lineno,
                        f"rubrics[{j}].evidence"), terms=_strings(obj.get("terms", []), path, lineno,
                        f"rubrics[{j}].terms", allow_empty=True), weight=float(weight),
                        depth=int(obj.get("depth", 0)), question=str(obj.get("question", "")))


def load_items(path: str | Path | None = None) -> dict[str, QueryItems]:
    """Read and validate an items file (``None``: the embedded one), keyed by query id (ids as strings)."""
    path = EMBEDDED_ITEMS_PATH if path is None else Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"items file not found: {path} (build one with scripts/build_rubrics.py)")
    out: dict[str, QueryItems] = {}
    for lineno, obj in iter_jsonl(path):
        if "id" not in obj or not isinstance(obj.get("prompt"), str):
            raise DataFormatError(path, lineno, 'each line needs "id" and a string "prompt"')
        qid = str(obj["id"])
        if qid in out:
            raise DataFormatError(path, lineno, f"duplicate id {qid!r}")
        rubrics = obj.get("rubrics")
        if not isinstance(rubrics, list):
            raise DataFormatError(path, lineno, '"rubrics" must be a list of items')
        items = [_item(r, path, lineno, j) for j, r in enumerate(rubrics)]
        extra = {k: v for k, v in obj.items() if k not in ("id", "prompt", "rubrics")}
        out[qid] = QueryItems(qid, obj["prompt"], items, extra)
    if not out:
        raise DataFormatError(path, 1, "items file is empty")
    return out


@lru_cache(maxsize=4)
def cached_items(path: str | None = None) -> dict[str, QueryItems]:
    """:func:`load_items`, read once per process (the step asks every step; the file does not change)."""
    return load_items(path)


def items_lines(queries: list[QueryItems]) -> str:
    """The file's text: one compact, key-stable JSON line per query (what the digest is taken over)."""
    return "".join(json.dumps(q.to_dict(), ensure_ascii=False, separators=(",", ":")) + "\n" for q in queries)


def text_digest(text: str) -> str:
    """``sha256:<hex>`` of a text's UTF-8 bytes."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def file_digest(path: str | Path) -> str:
    """``sha256:<hex>`` of a file's bytes: the identity of an item set on cards and in manifests."""
    return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()
