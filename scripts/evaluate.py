#!/usr/bin/env python
"""Evaluate a trained checkpoint: generate DeepResearch-Bench-style articles, then judge them.

    python scripts/evaluate.py --model logs/tiny_score/<run>/export --queries query.jsonl --out raw_data/score.jsonl
    python scripts/evaluate.py --model <run>/export --queries embedded --split heldout --samples 8 --out held.jsonl
    python scripts/evaluate.py card --articles held.jsonl [--baseline other/held.card.json]
    python scripts/evaluate.py judge --articles raw_data/score.jsonl \\
        --judge-base-url http://localhost:8001/v1 --judge-model Qwen2.5-72B-Instruct
    python scripts/evaluate.py judge --articles drb2.jsonl --drb2-tasks tasks_and_rubrics.jsonl \
        --no-quality --no-citations --judge-base-url http://localhost:8001/v1 --judge-model Qwen2.5-72B-Instruct

See docs/EVALUATION.md and `python scripts/evaluate.py {generate,judge,card} --help`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout, uninstalled

from score_lightning.evaluation import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
