#!/usr/bin/env python
"""Evidence-backed rubric items (DeepRubric) for a query set, from a corpus and its retriever.

    python scripts/build_rubrics.py                       # the embedded queries' items (the packaged asset)
    python scripts/build_rubrics.py --check               # rebuild them and compare with the packaged digest
    python scripts/build_rubrics.py --queries my_queries.jsonl --corpus my_corpus.jsonl --out my_items.jsonl
    python scripts/build_rubrics.py --queries my_queries.jsonl --retriever-url http://127.0.0.1:8000/retrieve \\
        --out my_items.jsonl --topics topics.txt          # a /retrieve server; new queries from seed topics
    python scripts/build_rubrics.py ... --reword-base-url http://127.0.0.1:8001/v1 --reword-model M

Per query, an evidence tree (sub-questions expanded recursively, each answered by retrieved passages) whose
passages become atomic binary items: a statement, the ids that support it and the terms a report must state
(``score_lightning.evaluation.items``). Deterministic: the same corpus, queries and flags give the same bytes, and the
manifest (``<out stem>.manifest.json``) records the digests of all three. ``--topics`` (one topic per line)
adds a synthesised training query per topic, asked about exactly the passages its items check.
``--reword-*`` (optional) lets an OpenAI-compatible model reword each item's text; evidence and terms stay.
The output loads with ``rubric=given rubric.path=OUT``, ``reward.rule_quality=item_recall reward.items_path=OUT``
and ``scripts/evaluate.py card --items OUT``. Last line: ``items=N queries=M digest=sha256:...``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from score_lightning.data.corpus import STDLIB_CORPUS_VERSION, default_corpus_path, load_corpus  # noqa: E402
from score_lightning.data.queries import EMBEDDED_QUERIES_PATH, load_queries  # noqa: E402
from score_lightning.evaluation.items.build import BuildSettings, build_items, manifest  # noqa: E402
from score_lightning.data.items import (  # noqa: E402
    EMBEDDED_ITEMS_MANIFEST, EMBEDDED_ITEMS_PATH, file_digest, items_lines, text_digest)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--queries", default="embedded", help="query JSONL {id, prompt, ...} (default: the embedded 60)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--corpus", default=None, help="JSONL corpus {id, contents} searched with BM25 "
                                                    "(default: the embedded stdlib corpus)")
    src.add_argument("--retriever-url", default=None, help="a Search-R1 /retrieve server instead of a corpus file")
    p.add_argument("--out", default=None, help=f"items JSONL (default: the packaged {EMBEDDED_ITEMS_PATH.name})")
    p.add_argument("--topics", default=None, help="file with one seed topic per line: a synthesised query each")
    p.add_argument("--depth", type=int, default=2, help="evidence tree depth below the question")
    p.add_argument("--branch", type=int, default=3, help="sub-questions per node")
    p.add_argument("--topk", type=int, default=2, help="passages retrieved per sub-question")
    p.add_argument("--max-items", type=int, default=6, help="items kept per query")
    p.add_argument("--min-items", type=int, default=3, help="off-topic or term-less passages fill a query up to this")
    p.add_argument("--no-tree", action="store_true", help="leave the evidence trees out of the file")
    p.add_argument("--reword-base-url", default=None, help="OpenAI-compatible endpoint that rewords item texts")
    p.add_argument("--reword-model", default=None)
    p.add_argument("--reword-api-key-env", default="OPENAI_API_KEY")
    p.add_argument("--check", action="store_true", help="rebuild and compare with the manifest's digest; write nothing")
    return p.parse_args(argv)


def _retriever(args: argparse.Namespace):
    """The retriever, the ids it can cite (for entity detection) and the corpus' identity for the manifest."""
    from score_lightning.retrieval.factory import build_retriever

    if args.retriever_url:
        return build_retriever("http", url=args.retriever_url), frozenset(), {"url": args.retriever_url}
    path = Path(args.corpus) if args.corpus else default_corpus_path()
    ident = {"path": str(path) if args.corpus else "embedded stdlib corpus", "digest": file_digest(path)}
    if not args.corpus:
        ident["stdlib_corpus_version"] = STDLIB_CORPUS_VERSION
    return build_retriever("bm25", corpus_path=path), frozenset(d.id for d in load_corpus(path)), ident


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    queries_path = EMBEDDED_QUERIES_PATH if args.queries == "embedded" else Path(args.queries)
    queries = [(q.id, q.prompt, q.extra) for q in load_queries(queries_path)]
    topics = [t.strip() for t in Path(args.topics).read_text(encoding="utf-8").splitlines() if t.strip()] \
        if args.topics else []
    retriever, known_ids, corpus = _retriever(args)
    settings = BuildSettings(args.depth, args.branch, args.topk, args.max_items, args.min_items)
    items = build_items(queries, retriever, known_ids, settings, topics)
    if args.no_tree:
        for q in items:
            q.extra.pop("tree", None)
    reworded = None
    if args.reword_base_url:
        from score_lightning.clients.chat import ChatClient
        from score_lightning.evaluation.items.reword import reword_items

        if not args.reword_model:
            raise SystemExit("--reword-base-url needs --reword-model")
        client = ChatClient(args.reword_base_url, args.reword_model, os.environ.get(args.reword_api_key_env))
        items, reworded = reword_items(items, client)
        print(f"reworded {reworded['reworded']} items; kept the programmatic text of {reworded['failed']} "
              f"({reworded['errors'] or 'no failures'})")
    text = items_lines(items)
    out = Path(args.out) if args.out else EMBEDDED_ITEMS_PATH
    if args.check:
        man_path = out.with_suffix(".manifest.json")
        want = json.loads(man_path.read_text())["items"]["digest"]
        got = text_digest(text)
        print(f"{'same' if got == want else 'DIFFERENT'}: rebuilt {got}, {man_path.name} records {want}")
        return 0 if got == want else 1
    command = "python scripts/build_rubrics.py" + "".join(f" {shlex.quote(a)}" for a in (argv or sys.argv[1:]))
    man = manifest(items, text, settings, queries_path=queries_path if args.queries != "embedded" else
                   "embedded queries.jsonl", corpus=corpus, topics=topics, command=command, reworded=reworded)
    if args.queries == "embedded":
        man["queries"]["digest"] = file_digest(EMBEDDED_QUERIES_PATH)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    (EMBEDDED_ITEMS_MANIFEST if out == EMBEDDED_ITEMS_PATH else out.with_suffix(".manifest.json")).write_text(
        json.dumps(man, indent=1) + "\n")
    print(f"items={man['items']['count']} queries={len(items)} digest={man['items']['digest']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
