#!/usr/bin/env python
"""How many texts the reader's citation rule reads differently from the old "any [id]" rule.

    python scripts/bench_citation_rule.py            # the embedded corpus and experiment=tiny_score's cold-start demos

The old rule took every bracketed id, so ``sys.argv[1]`` cited id ``1``; the rule of
``score_lightning.rewards.citations`` leaves out subscripts, calls, markdown links and code. Counts the
corpus passages and the demonstrations (solver answers, and whole demo texts) whose cited ids differ,
and prints a digest of the demonstrations' token ids, which names the packaged cold start's inputs.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_common import compose  # noqa: E402

#: the rule before: any bracketed loadable id
OLD = re.compile(r"\[([^\s\[\]]+)\]")


def old_ids(text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(OLD.findall(text)))


def main() -> int:
    from score_lightning.data.corpus import load_corpus
    from score_lightning.launch.training import resolve_model_path
    from score_lightning.paths import corpus_path
    from score_lightning.policy.models import load_tokenizer
    from score_lightning.rewards.citations import cited_ids
    from score_lightning.sft.train import build_sft_demos

    cfg = compose(["experiment=tiny_score"])
    tok = load_tokenizer(resolve_model_path(cfg))
    demos, _ = build_sft_demos(cfg, tok)
    digest = hashlib.sha256()
    for d in demos:
        digest.update(json.dumps([d.kind, list(d.prompt_ids), list(d.response_ids)]).encode())
    answers = [t for t in (tok.decode(d.response_ids) for d in demos) if "<answer>" in t]
    texts = [tok.decode(list(d.prompt_ids) + list(d.response_ids)) for d in demos]
    passages = [d.contents for d in load_corpus(corpus_path(cfg))]
    differ = lambda xs: sum(old_ids(x) != cited_ids(x) for x in xs)  # noqa: E731
    spurious = sum(len(set(old_ids(p)) - set(cited_ids(p))) for p in passages)
    print(f"corpus_passages={len(passages)} corpus_read_differently={differ(passages)} "
          f"corpus_old_only_ids={spurious} demo_answers={len(answers)} demo_answers_read_differently={differ(answers)} "
          f"demo_texts={len(texts)} demo_texts_read_differently={differ(texts)} demos_digest={digest.hexdigest()[:16]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
