#!/usr/bin/env python
"""Build the packaged preference pairs (``evaluator.reward=preference``) from an items file's training queries.

    python scripts/build_preferences.py                     # the embedded items -> data/assets/preferences.jsonl
    python scripts/build_preferences.py --items FILE --out DIR/pairs.jsonl
    python scripts/build_preferences.py --pair-set test --pair-set-out DIR/test_pairs.jsonl   # for bench_evaluator

Two pairs per training query, ordered by verifiable ``item_recall``, split 8:1:1 by question
(:mod:`score_lightning.methods.preference.pairs`). Writes the JSONL and ``<name>.manifest.json`` with its sha256
digest and the items file's; the same items give the same bytes. Last line: ``pairs=N train=a val=b test=c digest=D``.
``--pair-set SPLIT`` (``heldout``: ``val`` and ``test`` together) also writes that split as a ``scripts/bench_evaluator.py`` pair set (all ``valid`` pairs), so
``bench_evaluator.py --pair-set FILE`` measures a rubric writer's pairwise accuracy, AUC and Cohen's d on held-out
preference pairs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from score_lightning.data.items import EMBEDDED_ITEMS_PATH, file_digest, load_items, text_digest  # noqa: E402
from score_lightning.methods.preference.pairs import build_pairs, pairs_text  # noqa: E402

DEFAULT_OUT = EMBEDDED_ITEMS_PATH.with_name("preferences.jsonl")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", default=str(EMBEDDED_ITEMS_PATH), help="an items file (scripts/build_rubrics.py)")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="the pairs file to write")
    ap.add_argument("--pair-set", choices=("train", "val", "test", "heldout"), default=None,
                    help="also write this split as a bench_evaluator.py pair set (heldout: val and test together)")
    ap.add_argument("--pair-set-out", default=None, help="where (default: <out dir>/preferences_<split>_pairs.jsonl)")
    args = ap.parse_args(argv)
    pairs = build_pairs(list(load_items(args.items).values()))
    text = pairs_text(pairs)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    splits = Counter(p["split"] for p in pairs)
    items = Path(args.items)
    manifest = {"file": out.name, "digest": text_digest(text), "pairs": len(pairs), "splits": dict(sorted(splits.items())),
                "items": items.name if items.resolve() == EMBEDDED_ITEMS_PATH.resolve() else str(items),
                "items_digest": file_digest(items), "builder": "python scripts/build_preferences.py"}
    out.with_name(out.name.removesuffix(".jsonl") + ".manifest.json").write_text(
        json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    if args.pair_set:
        from score_lightning.evaluation.pair_set import write_pair_set
        from score_lightning.methods.preference.pairs import as_pair_set

        target = Path(args.pair_set_out or out.with_name(f"preferences_{args.pair_set}_pairs.jsonl"))
        held = as_pair_set(pairs, load_items(args.items), args.pair_set)
        digest = write_pair_set(target, held, {"source": str(out), "source_digest": manifest["digest"],
                                               "split": args.pair_set, "kind": "preference pairs"})
        print(f"pair set: {target} ({len(held)} pairs, {digest})")
    print(f"pairs={len(pairs)} train={splits['train']} val={splits['val']} test={splits['test']} "
          f"digest={manifest['digest']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
