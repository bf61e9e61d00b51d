"""DeepResearch Bench II's task-and-rubric file, loaded in its published format.

DeepResearch Bench II (<https://github.com/imlrz/DeepResearch-Bench-II>, ``tasks_and_rubrics.jsonl``)
ships tasks and rubrics in **one** JSONL file, one task per line::

    {"id": "task7", "idx": 1, "language": "zh", "theme": "Finance & Business",
     "description": "...", "prompt": "<task text> + a rule naming the blocked source article",
     "content": {"task": "<task text>",
                 "rubric": {"info_recall": ["...", ...], "analysis": [...], "presentation": [...]},
                 "blocked": {"title": "...", "authors": [...], "urls": [...]}}}

Rubric items are plain strings (no ids, no weights): binary checks grouped by dimension. ``prompt``
is what the agent under test is asked (so ``generate --queries`` reads the file as is); the judge
gets ``content.task`` and ``content.blocked`` (the expert article the rubrics come from, which the
report must not cite). Every line is validated; errors say ``file:line``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from score_lightning.data.corpus import DataFormatError, iter_jsonl

#: DRB-II's rubric dimensions, in the order its evaluator concatenates them into batches.
DIMENSIONS: tuple[str, ...] = ("info_recall", "analysis", "presentation")


@dataclass(frozen=True)
class Drb2Task:
    id: str
    idx: int
    prompt: str
    task: str
    rubric: dict[str, tuple[str, ...]]  # dimension -> items, as published (duplicates kept)
    blocked: dict[str, Any] = field(default_factory=dict)  # {} when the line has none
    language: str = ""
    theme: str = ""
    description: str = ""

    def items(self) -> list[str]:
        """Every item in the evaluator's order (info_recall, analysis, presentation), duplicates kept."""
        return [item for dim in DIMENSIONS for item in self.rubric[dim]]

    def distinct(self, dim: str) -> list[str]:
        """The dimension's distinct items, first occurrence first: what DRB-II scores (it keys by text)."""
        return list(dict.fromkeys(self.rubric[dim]))

    def batches(self, chunk_size: int) -> list[list[str]]:
        """The items cut into consecutive batches of ``chunk_size`` (0 or more than all: one batch)."""
        items = self.items()
        if chunk_size <= 0 or chunk_size >= len(items):
            return [items]
        return [items[i:i + chunk_size] for i in range(0, len(items), chunk_size)]


def _string(obj: dict, key: str, path: Path, lineno: int, where: str = "", *, required: bool = True,
            nonempty: bool = True) -> str:
    if key not in obj:
        if required:
            raise DataFormatError(path, lineno, f'missing field "{where}{key}"')
        return ""
    value = obj[key]
    if not isinstance(value, str) or (nonempty and not value.strip()):
        raise DataFormatError(path, lineno, f'"{where}{key}" must be a non-empty string, got {value!r:.60}')
    return value


def _rubric(content: dict, path: Path, lineno: int) -> dict[str, tuple[str, ...]]:
    rubric = content.get("rubric")  # data, not config
    if not isinstance(rubric, dict):
        raise DataFormatError(path, lineno, '"content.rubric" must be an object {"info_recall": [...], '
                                            '"analysis": [...], "presentation": [...]}')
    unknown = sorted(set(rubric) - set(DIMENSIONS))
    if unknown:
        raise DataFormatError(path, lineno, f'"content.rubric" has unknown dimension(s) {unknown}; '
                                            f"expected {list(DIMENSIONS)}")
    out: dict[str, tuple[str, ...]] = {}
    for dim in DIMENSIONS:
        items = rubric.get(dim)
        if not isinstance(items, list):
            raise DataFormatError(path, lineno, f'"content.rubric.{dim}" must be a list of strings')
        for j, item in enumerate(items):
            if not isinstance(item, str) or not item.strip():
                raise DataFormatError(path, lineno,
                                      f'"content.rubric.{dim}[{j}]" must be a non-empty string, got {item!r:.60}')
        out[dim] = tuple(items)
    if not any(out.values()):
        raise DataFormatError(path, lineno, '"content.rubric" has no items')
    return out


def _blocked(content: dict, path: Path, lineno: int) -> dict[str, Any]:
    blocked = content.get("blocked")
    if blocked is None:
        return {}
    if not isinstance(blocked, dict):
        raise DataFormatError(path, lineno, f'"content.blocked" must be an object, got {type(blocked).__name__}')
    if "title" in blocked and not isinstance(blocked["title"], str):
        raise DataFormatError(path, lineno, '"content.blocked.title" must be a string')
    for key in ("authors", "urls"):
        value = blocked.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise DataFormatError(path, lineno, f'"content.blocked.{key}" must be a list of strings')
    return dict(blocked)


def parse_task_line(obj: dict, path: Path, lineno: int) -> Drb2Task:
    """One line of ``tasks_and_rubrics.jsonl``; a :class:`DataFormatError` names ``path:lineno``."""
    task_id = _string(obj, "id", path, lineno)
    idx = obj.get("idx")
    if isinstance(idx, bool) or not isinstance(idx, int):
        raise DataFormatError(path, lineno, f'"idx" must be an integer, got {idx!r}')
    prompt = _string(obj, "prompt", path, lineno)
    content = obj.get("content")
    if not isinstance(content, dict):
        raise DataFormatError(path, lineno, '"content" must be an object {"task", "rubric", "blocked"}')
    return Drb2Task(
        id=task_id, idx=idx, prompt=prompt, task=_string(content, "task", path, lineno, "content."),
        rubric=_rubric(content, path, lineno), blocked=_blocked(content, path, lineno),
        language=_string(obj, "language", path, lineno, required=False, nonempty=False),
        theme=_string(obj, "theme", path, lineno, required=False, nonempty=False),
        description=_string(obj, "description", path, lineno, required=False, nonempty=False),
    )


def load_drb2_tasks(path: str | Path) -> dict[str, Drb2Task]:
    """``{task id: task}`` from a ``tasks_and_rubrics.jsonl``, every line checked (ids and idx unique)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"DeepResearch Bench II tasks file not found: {path}")
    tasks: dict[str, Drb2Task] = {}
    first_line: dict[str, int] = {}
    idx_line: dict[int, int] = {}
    for lineno, obj in iter_jsonl(path):
        task = parse_task_line(obj, path, lineno)
        if task.id in first_line:
            raise DataFormatError(path, lineno, f"duplicate id {task.id!r} (first on line {first_line[task.id]})")
        if task.idx in idx_line:
            raise DataFormatError(path, lineno, f"duplicate idx {task.idx} (first on line {idx_line[task.idx]})")
        first_line[task.id], idx_line[task.idx] = lineno, lineno
        tasks[task.id] = task
    if not tasks:
        raise DataFormatError(path, 1, "no tasks in the file")
    return tasks
