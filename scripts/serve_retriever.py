#!/usr/bin/env python
"""Serve a BM25 index over HTTP (Search-R1 ``/retrieve`` API) so several training nodes share it.

    python scripts/serve_retriever.py --index-dir .cache/bm25 --port 8000
    python src/train.py retriever=http retriever.url=http://HOST:8000/retrieve
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout, uninstalled

import uvicorn  # noqa: E402

from score_lightning.data.corpus import default_corpus_path  # noqa: E402
from score_lightning.retrieval.bm25 import BM25Retriever  # noqa: E402
from score_lightning.retrieval.server import make_app  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default=None, help="JSONL corpus {id, contents}; default: the stdlib corpus")
    p.add_argument("--index-dir", default=None, help="where to save/load the BM25 index (reused if the corpus is unchanged)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (0.0.0.0 to serve other nodes)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--k1", type=float, default=1.5)
    p.add_argument("--b", type=float, default=0.75)
    args = p.parse_args(argv)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    corpus = Path(args.corpus) if args.corpus else default_corpus_path()
    retriever = BM25Retriever(corpus, index_dir=args.index_dir, k1=args.k1, b=args.b)
    logging.info("BM25 over %d passages from %s (%s); serving POST http://%s:%d/retrieve",
                 len(retriever), corpus, "index loaded" if retriever.loaded_from_disk else "index built",
                 args.host, args.port)
    uvicorn.run(make_app(retriever), host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
