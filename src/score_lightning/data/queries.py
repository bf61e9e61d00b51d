"""Research queries: JSONL ``{"id", "prompt", ...}``.

DeepResearch Bench's ``query.jsonl`` (integer ids, extra ``topic``/``language`` fields) loads as-is,
so evaluation output can be matched back to the benchmark by id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from score_lightning.data.corpus import DataFormatError, iter_jsonl

#: Deep-research questions about the Python standard library, answerable from the stdlib corpus.
EMBEDDED_QUERIES_PATH: Path = Path(__file__).resolve().parent / "assets" / "queries.jsonl"


@dataclass
class Query:
    id: str
    prompt: str
    extra: dict = field(default_factory=dict)  # every other field of the line, untouched


#: Splits of a query file with a ``"split"`` field; lines without one are training queries.
SPLITS = ("train", "heldout")


def load_queries(path: str | Path | None = None, split: str | None = None) -> list[Query]:
    """Load and validate a query file (``None``: the embedded stdlib questions).

    The original ``id`` (an int in DeepResearch Bench) is kept as ``str`` in ``Query.id``; the raw
    value stays in ``extra["id"]`` when it was not already a string, so exports can restore it.
    ``split`` keeps only the lines of that split (``"train"``: also lines without a ``"split"``).
    The embedded questions hold out every third one (20 of 60) for evaluation: those appear in no
    training batch, no cold-start demonstration and not in the tiny tokenizer's training text.
    """
    if split is not None and split not in SPLITS:
        raise ValueError(f"split={split!r}: allowed {SPLITS} or None (all queries)")
    path = EMBEDDED_QUERIES_PATH if path is None else Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"query file not found: {path}")
    queries: list[Query] = []
    seen: dict[str, int] = {}
    for lineno, obj in iter_jsonl(path):
        if "id" not in obj:
            raise DataFormatError(path, lineno, 'missing field "id" (each line needs "id" and "prompt")')
        raw_id = obj["id"]
        if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)) or str(raw_id).strip() == "":
            raise DataFormatError(path, lineno, f'"id" must be a non-empty string or an integer, got {raw_id!r}')
        prompt = obj.get("prompt")
        if "prompt" not in obj:
            raise DataFormatError(path, lineno, 'missing field "prompt" (each line needs "id" and "prompt")')
        if not isinstance(prompt, str) or not prompt.strip():
            raise DataFormatError(path, lineno, f'"prompt" must be a non-empty string, got {prompt!r:.60}')
        qid = str(raw_id)
        if qid in seen:
            raise DataFormatError(path, lineno, f"duplicate id {qid!r} (first seen on line {seen[qid]})")
        seen[qid] = lineno
        extra = {k: v for k, v in obj.items() if k not in ("id", "prompt")}
        if not isinstance(raw_id, str):
            extra["id"] = raw_id
        queries.append(Query(id=qid, prompt=prompt, extra=extra))
    if not queries:
        raise DataFormatError(path, 1, "query file is empty")
    if split is not None:
        queries = [q for q in queries if q.extra.get("split", "train") == split]  # data, not config
        if not queries:
            raise DataFormatError(path, 1, f'no queries with "split": "{split}"')
    return queries
