#!/usr/bin/env python
"""Serve a BM25 index over HTTP (Search-R1 ``/retrieve`` API) so several training nodes share it.

    python scripts/serve_retriever.py --index-dir .cache/bm25 --port 8000            # loopback only
    SCORE_RETRIEVER_TOKEN=secret python scripts/serve_retriever.py --host 0.0.0.0 --port 8000
    SCORE_RETRIEVER_TOKEN=secret python src/train.py retriever=http retriever.url=http://HOST:8000/retrieve

Beyond loopback the server needs a bearer token (``--token`` or ``$SCORE_RETRIEVER_TOKEN``; prefer the
variable, a command line is visible in ``ps``) unless ``--allow-unauthenticated`` is given. Each
request is bounded: oversized bodies get 413, too many or too long queries and a ``topk`` out of
range get 422, a missing or wrong token 401.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout, uninstalled

from score_lightning.launch.retrieval_server import (  # noqa: E402
    TOKEN_ENV, ServerLimits, check_exposure, make_app, token_from_env,
)

_D = ServerLimits()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default=None, help="JSONL corpus {id, contents}; default: the stdlib corpus")
    p.add_argument("--index-dir", default=None, help="where to save/load the BM25 index (reused if the corpus is unchanged)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (0.0.0.0 to serve other nodes: needs a token)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--k1", type=float, default=1.5)
    p.add_argument("--b", type=float, default=0.75)
    g = p.add_argument_group("access")
    g.add_argument("--token", default=None, help=f"bearer token clients must send (default: ${TOKEN_ENV})")
    g.add_argument("--allow-unauthenticated", action="store_true",
                   help="serve beyond loopback without a token (trusted networks only)")
    g = p.add_argument_group("limits (413 / 422 beyond them)")
    g.add_argument("--max-queries", type=int, default=_D.max_queries, help="queries per request (default %(default)s)")
    g.add_argument("--max-query-chars", type=int, default=_D.max_query_chars, help="characters per query (default %(default)s)")
    g.add_argument("--min-topk", type=int, default=_D.min_topk, help="(default %(default)s)")
    g.add_argument("--max-topk", type=int, default=_D.max_topk, help="(default %(default)s)")
    g.add_argument("--max-body-bytes", type=int, default=_D.max_body_bytes, help="request body size (default %(default)s = 4 MiB)")
    g.add_argument("--limit-concurrency", type=int, default=None,
                   help="open connections beyond which uvicorn answers 503 (clients retry with backoff); default: no limit")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    token = token_from_env(args.token)
    check_exposure(args.host, token, args.allow_unauthenticated)  # before the (slow) index load
    try:
        limits = ServerLimits(max_queries=args.max_queries, max_query_chars=args.max_query_chars,
                              min_topk=args.min_topk, max_topk=args.max_topk, max_body_bytes=args.max_body_bytes)
    except ValueError as exc:
        raise SystemExit(f"bad limit: {exc}") from exc

    import uvicorn

    from score_lightning.data.corpus import default_corpus_path
    from score_lightning.retrieval.bm25 import BM25Retriever

    corpus = Path(args.corpus) if args.corpus else default_corpus_path()
    retriever = BM25Retriever(corpus, index_dir=args.index_dir, k1=args.k1, b=args.b)
    logging.info("BM25 over %d passages from %s (%s); serving POST http://%s:%d/retrieve (%s; limits %s)",
                 len(retriever), corpus, "index loaded" if retriever.loaded_from_disk else "index built",
                 args.host, args.port, "bearer token required" if token else "no token", limits)
    uvicorn.run(make_app(retriever, limits=limits, token=token), host=args.host, port=args.port,
                log_level="info", limit_concurrency=args.limit_concurrency)


if __name__ == "__main__":
    main()
