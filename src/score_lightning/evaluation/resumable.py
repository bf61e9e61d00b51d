"""Append-only JSONL files that survive interruption: read with repair, append with fsync.

``generate`` writes one article line and one sources line per query, batch by batch, and resumes an
interrupted run from what is on disk. The rules for what an interrupted file may look like live here:

* a last line without its newline (an interrupted write) is kept when it is a complete record (only
  the newline is added), otherwise cut off so that record is regenerated;
* any other unreadable line is an error in the article file (it is not an interrupted append: fix
  or delete it), and skipped with a warning in the sources file;
* the sources file is filtered to ids present in the article file (its last entry per id and
  ``sample``), so a deleted article line gets fresh sources entries when it is regenerated, and no
  sample of a query is ever recorded twice.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)


def read_jsonl_resumable(path: Path, required: Sequence[str], *, strict: bool) -> tuple[list[dict], str | None]:
    """Read a JSONL file we append to, repairing an interrupted last write in place.

    Returns the records and a note when the file was repaired. A final line without ``\\n`` that
    is a complete record gets its newline; otherwise it is cut off. With ``strict``, any other bad
    line raises ``ValueError``; without, it is skipped with a warning.
    """
    if not path.exists():
        return [], None
    data = path.read_bytes()
    if not data:
        return [], None
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    records: list[dict] = []

    def parse(raw: bytes) -> dict | None:
        try:
            obj = json.loads(raw)
        except ValueError:
            return None
        return obj if isinstance(obj, dict) and all(k in obj for k in required) else None

    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        obj = parse(raw)
        if obj is None:
            msg = (f"{path}:{lineno}: not a JSON object with {list(required)}; only the last line can be "
                   "an interrupted write, so this file was edited or mixed: fix or delete the line")
            if strict:
                raise ValueError(msg)
            log.warning("%s (skipped)", msg)
            continue
        records.append(obj)
    note = None
    if tail.strip():
        obj = parse(tail)
        if obj is not None:
            with open(path, "ab") as fh:
                fh.write(b"\n")
            records.append(obj)
            note = f"{path}: last line lacked its newline (added)"
        else:
            with open(path, "r+b") as fh:
                fh.truncate(len(data) - len(tail))
            note = f"{path}: dropped a truncated last line ({len(tail)} bytes, an interrupted write)"
        log.warning(note)
    return records, note


def dump_line(obj: dict) -> bytes:
    """One JSONL record, UTF-8 kept readable."""
    return (json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8")


def append_lines(path: Path, lines: list[bytes]) -> None:
    """Append ``lines`` and fsync, so a finished batch is on disk before the next one starts."""
    if not lines:
        return
    with open(path, "ab") as fh:
        fh.write(b"".join(lines))
        fh.flush()
        os.fsync(fh.fileno())


def sync_sources(path: Path, done: set[str]) -> str | None:
    """Keep only the last sources entry of each (id, sample) whose id is in the article file (rewritten
    atomically; a record without ``sample`` is sample 0)."""
    records, note = read_jsonl_resumable(path, ("id",), strict=False)
    if not records:
        return note
    last: dict[tuple[str, int], dict] = {}
    for rec in records:
        last[(str(rec["id"]), int(rec.get("sample", 0)))] = rec
    keep = [rec for (key, _), rec in last.items() if key in done]
    if len(keep) == len(records):
        return note
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(b"".join(dump_line(r) for r in keep))
    os.replace(tmp, path)
    extra = f"{path}: dropped {len(records) - len(keep)} entries without an article (stale or duplicate)"
    log.info(extra)
    return f"{note}; {extra}" if note else extra
