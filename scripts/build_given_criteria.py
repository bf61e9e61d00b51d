#!/usr/bin/env python
"""Write the small DeepResearch-Bench-format criteria file bundled for the embedded queries.

    python scripts/build_given_criteria.py   # -> src/score_lightning/data/assets/criteria_tiny.jsonl

``experiment=given_tiny`` trains against these fixed per-query rubrics. Each query gets criteria on
the four RACE dimensions, derived from the names the question asks about (a deterministic rule, so
the file is reproducible): cover each named API, cite the documents behind the claims, compare and
recommend when asked, end with a clear conclusion. Small on purpose: the tiny model's prompt budget
holds about six criteria.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from score_lightning.data.queries import load_queries  # noqa: E402
from score_lightning.roles.text import query_entities  # noqa: E402

OUT = ROOT / "src" / "score_lightning" / "data" / "assets" / "criteria_tiny.jsonl"
DIMENSION_WEIGHTS = {"comprehensiveness": 0.3, "insight": 0.3, "instruction_following": 0.25, "readability": 0.15}


def criteria_for(prompt: str) -> dict[str, list[dict]]:
    names = query_entities(prompt)[:3] or ["the module the question names"]
    compares = any(w in prompt.lower() for w in ("compare", "differ", "versus", " or ", "which"))
    crit = {
        "comprehensiveness": [{"criterion": f"Explains what {n} does, as the documentation describes it",
                               "explanation": "each named API is covered", "weight": 1.0} for n in names[:2]],
        "insight": [{"criterion": ("States when to prefer one option over the other and why" if compares else
                                   "Explains why the behaviour is designed this way, not only what it does"),
                     "explanation": "analysis beyond restating sources", "weight": 1.0}],
        "instruction_following": [{"criterion": "Backs its claims with [doc_id] citations of retrieved documents",
                                   "explanation": "citations the trajectory retrieved", "weight": 1.0}],
        "readability": [{"criterion": "Ends with a one-sentence conclusion that answers the question",
                         "explanation": "a clear bottom line", "weight": 1.0}],
    }
    return crit


def main() -> int:
    lines = []
    for q in load_queries(None):
        lines.append(json.dumps({"id": q.id, "prompt": q.prompt, "dimension_weight": DIMENSION_WEIGHTS,
                                 "criterions": criteria_for(q.prompt)}, ensure_ascii=False))
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {len(lines)} rubrics to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
