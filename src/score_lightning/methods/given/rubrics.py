"""``rubric=given``: fixed per-query rubrics from a file, matched to the queries by id.

Three formats, each loaded as is and validated line by line (errors say ``file:line``):

* DeepResearch Bench ``criteria.jsonl``: ``{"id", "prompt", "dimension_weight": {dim: w},
  "criterions": {dim: [{"criterion", "explanation", "weight"}]}}``. As DRB's RACE does, criterion
  weights are normalised within their dimension and dimension weights across dimensions, so the
  item weights are ``W_d / sum(W) * w_c / sum_d(w)`` and sum to 1.
* binary checklists (DeepRubric; the items ``scripts/build_rubrics.py`` writes): ``{"id", "rubrics":
  [{"text", "weight", "type": "binary"}]}``; weights are normalised to sum to 1 and each item scores 1 when
  met, else 0;
* DeepResearch Bench II's ``tasks_and_rubrics.jsonl`` as published (``{"id", "content": {"rubric":
  {"info_recall": [...], "analysis": [...], "presentation": [...]}}, ...}``): its distinct items, equal
  weights, binary.

A report's rubric reward is the weighted criterion score in [0, 1], entering R_s exactly as SCORE's
dimension scores do. A query without a given rubric uses the harness fallback rubric and is counted
(``rubric/missing_rate``); it never crashes a run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from score_lightning.data.corpus import DataFormatError, iter_jsonl
from score_lightning.data.drb2_tasks import parse_task_line
from score_lightning.roles.evidence import EvidenceDoc
from score_lightning.roles.rubric import Rubric, fallback_rubric
from score_lightning.step.rubric_source import RubricContext
from score_lightning.step.types import StepRubric


def _positive(value, path: Path, lineno: int, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise DataFormatError(path, lineno, f"{what} must be a positive number, got {value!r}")
    return float(value)


def _drb_rubric(obj: dict, path: Path, lineno: int, include_explanation: bool) -> Rubric:
    dw, crit = obj.get("dimension_weight"), obj.get("criterions")
    if not isinstance(dw, dict) or not dw or not isinstance(crit, dict):
        raise DataFormatError(path, lineno, '"dimension_weight" and "criterions" must be non-empty objects')
    total_w = sum(_positive(w, path, lineno, f"dimension_weight.{d}") for d, w in dw.items())
    texts, weights = [], []
    for dim, w_dim in dw.items():
        items = crit.get(dim)
        if not isinstance(items, list) or not items:
            raise DataFormatError(path, lineno, f'"criterions" has no list for dimension {dim!r}')
        inner = 0.0
        for j, c in enumerate(items):
            if not isinstance(c, dict) or not isinstance(c.get("criterion"), str) or not c["criterion"].strip():
                raise DataFormatError(path, lineno, f"criterions.{dim}[{j}] needs a non-empty \"criterion\"")
            inner += _positive(c.get("weight"), path, lineno, f"criterions.{dim}[{j}].weight")  # data, not config
        for c in items:
            text = c["criterion"].strip()
            if include_explanation and isinstance(c.get("explanation"), str) and c["explanation"].strip():
                text += " (" + c["explanation"].strip() + ")"
            texts.append(f"[{dim}] {text}")
            weights.append(float(w_dim) / total_w * float(c["weight"]) / inner)
    return Rubric(tuple(f"c{j}" for j in range(1, len(texts) + 1)), tuple(weights), tuple(texts))


def _checklist_rubric(obj: dict, path: Path, lineno: int) -> Rubric:
    items = obj.get("rubrics")
    if not isinstance(items, list) or not items:
        raise DataFormatError(path, lineno, '"rubrics" must be a non-empty list')
    texts, weights, binary = [], [], True
    for j, it in enumerate(items):
        if not isinstance(it, dict) or not isinstance(it.get("text"), str) or not it["text"].strip():  # data, not config
            raise DataFormatError(path, lineno, f'rubrics[{j}] needs a non-empty "text"')
        weights.append(_positive(it.get("weight", 1.0), path, lineno, f"rubrics[{j}].weight"))  # data, not config
        kind = it.get("type", "binary")
        if kind not in ("binary", "graded"):
            raise DataFormatError(path, lineno, f'rubrics[{j}].type={kind!r}: allowed "binary" or "graded"')
        binary = binary and kind == "binary"
        texts.append(it["text"].strip())
    total = sum(weights)
    return Rubric(tuple(f"c{j}" for j in range(1, len(texts) + 1)), tuple(w / total for w in weights), tuple(texts),
                  binary=binary)


def _drb2_rubric(obj: dict, path: Path, lineno: int) -> Rubric:
    """A DeepResearch Bench II task line: its distinct binary items, dimension-tagged, equal weights (DRB-II
    scores a task by the share of its items met)."""
    task = parse_task_line(obj, path, lineno)
    texts = [f"[{dim}] {item}" for dim in task.rubric for item in task.distinct(dim)]
    return Rubric(tuple(f"c{j}" for j in range(1, len(texts) + 1)), tuple(1.0 / len(texts) for _ in texts),
                  tuple(texts), binary=True)


def load_given_rubrics(path: str | Path, include_explanation: bool = False,
                       max_items: int | None = None) -> dict[str, Rubric]:
    """``{query id: Rubric}`` from a DRB criteria file or a binary checklist file (format per line)."""
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(path, 0, "file not found")
    out: dict[str, Rubric] = {}
    for lineno, obj in iter_jsonl(path):
        if "id" not in obj:
            raise DataFormatError(path, lineno, 'each line needs an "id"')
        if "criterions" in obj:
            rubric = _drb_rubric(obj, path, lineno, include_explanation)
        elif "rubrics" in obj:
            rubric = _checklist_rubric(obj, path, lineno)
        elif isinstance(obj.get("content"), dict) and "rubric" in obj["content"]:
            rubric = _drb2_rubric(obj, path, lineno)
        else:
            raise DataFormatError(path, lineno, 'neither a DRB criteria line ("criterions"), a checklist ("rubrics") '
                                                'nor a DRB-II task ("content": {"rubric": ...})')
        key = str(obj["id"])
        if key in out:
            raise DataFormatError(path, lineno, f"duplicate id {key!r}")
        out[key] = _top(rubric, max_items) if max_items else rubric
    if not out:
        raise DataFormatError(path, 0, "no rubrics in the file")
    return out


def _top(rubric: Rubric, n: int) -> Rubric:
    """The ``n`` heaviest items, weights renormalised (a long DRB rubric must fit a small model's prompt)."""
    if len(rubric.dims) <= n:
        return rubric
    keep = sorted(sorted(range(len(rubric.dims)), key=lambda j: -rubric.weights[j])[:n])
    total = sum(rubric.weights[j] for j in keep)
    return Rubric(tuple(f"c{i}" for i in range(1, n + 1)), tuple(rubric.weights[j] / total for j in keep),
                  tuple(rubric.texts[j] for j in keep), rubric.binary)


@dataclass
class GivenRubrics:
    """Per-query rubrics from ``path``; the evaluator only scores with them (nothing to train)."""

    path: str
    include_explanation: bool = False
    max_items: int | None = None  # keep the heaviest items (renormalised); null: all
    trains_evaluator: bool = False
    rubrics: dict[str, Rubric] = field(init=False)

    def __post_init__(self) -> None:
        self.rubrics = load_given_rubrics(self.path, self.include_explanation, self.max_items)

    def step_rubrics(self, ctx: RubricContext, queries: Sequence[str], query_ids: Sequence[str],
                     evidence: Sequence[Sequence[EvidenceDoc]]) -> StepRubric:
        per_query, missing = [], []
        for qid in query_ids:
            rubric = self.rubrics.get(str(qid))
            missing.append(rubric is None)
            per_query.append(rubric if rubric is not None else fallback_rubric(ctx.state))
        stats = {"rubric/missing_rate": sum(missing) / max(len(missing), 1)}
        return StepRubric(per_query, [], True, "", stats, fallback=missing)

    def observe(self, *args, **kwargs) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        return None
