#!/usr/bin/env python
"""Export the policy of a training checkpoint as an HF model directory (e.g. after preemption), with the run's
config beside it (run_config.json), so scripts/evaluate.py samples the export as the run trained.

    python scripts/export.py logs/tiny_score/<run>/checkpoints/last.ckpt exported/
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout, uninstalled

from score_lightning.policy.export import export_checkpoint  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ckpt", help="a checkpoints/last.ckpt file or FSDP checkpoint directory")
    ap.add_argument("out", help="output directory (HF save_pretrained layout, with the tokenizer)")
    ap.add_argument("--model-path", default=None, help="base model, when the checkpoint's recorded one moved")
    args = ap.parse_args()
    try:
        out = export_checkpoint(args.ckpt, args.out, args.model_path)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"exported {args.ckpt} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
