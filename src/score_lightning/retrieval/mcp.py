"""``retriever=mcp``: search through a tool of an MCP server (``scripts/serve_mcp_search.py``, DR Tulu's
``mcp_backend``, any server the official SDK reaches over streamable HTTP or stdio).

Each query is one call of ``retriever.tool`` with ``{query_arg: query, topk_arg: topk, **extra_args}``
(``topk_arg: null`` for a tool without a count; its results are cut to topk here). The result, structured
content or JSON text (``clients/mcp.py``), becomes the ``{id, contents}`` documents the agent loop shows and
cites:

* the list of results is ``fields.results`` (a dotted path; null: the payload itself when it is a list, else
  its first list among ``results``, ``documents``, ``data``, ``organic``, ``result``, ``hits``);
* a document's id is ``fields.id`` (null: the first of ``id``, ``doc_id``, ``docid``, ``url``, ``link``);
  its contents ``contents`` as is, else ``"title"\\ntext`` from ``fields.title`` (``title``) and ``fields.text``
  (the first of ``text``, ``passage``, ``snippet``, ``content``, ``abstract``); its score ``fields.score``
  (``score``; none: by rank).

A result without an id is refused (:class:`~score_lightning.errors.RetrieverUnavailable`, naming the server):
reports cite documents as ``[id]``, so no report citing from it could ever be grounded. Faults behave as the
HTTP retriever's: a failed call is retried ``max_retries`` times (reconnecting), then a
:class:`~score_lightning.retrieval.base.RetrievalError` that the agent loop turns into a "retrieval failed"
observation and the step counts.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from score_lightning.clients.mcp import MCPError, MCPToolClient
from score_lightning.errors import RetrieverUnavailable
from score_lightning.retrieval.base import RetrievalError, SearchHit

log = logging.getLogger(__name__)

RESULT_LISTS = ("results", "documents", "data", "organic", "result", "hits")
ID_FIELDS = ("id", "doc_id", "docid", "url", "link")
TEXT_FIELDS = ("text", "passage", "snippet", "content", "abstract")


def _get(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(obj, Mapping) or part not in obj:
            return None
        obj = obj[part]
    return obj


def _first(obj: Mapping, keys: Sequence[str]) -> Any:
    return next((obj[k] for k in keys if obj.get(k) not in (None, "")), None)


class MCPRetriever:
    """A :class:`~score_lightning.retrieval.base.Retriever` over one MCP tool."""

    def __init__(self, tool: str = "search", url: str | None = None, command: str | Sequence[str] | None = None,
                 query_arg: str = "query", topk_arg: str | None = "topk", extra_args: Mapping[str, Any] | None = None,
                 fields: Mapping[str, str | None] | None = None, timeout_s: float = 10.0,
                 connect_timeout_s: float = 5.0, max_retries: int = 1, env: Mapping[str, str] | None = None) -> None:
        if max_retries < 0:
            raise ValueError(f"retriever.max_retries must be >= 0, got {max_retries}")
        self.client = MCPToolClient(tool, url, command, timeout_s=timeout_s, connect_timeout_s=connect_timeout_s,
                                    env=env)
        self.query_arg, self.topk_arg = query_arg, topk_arg
        self.extra_args = dict(extra_args or {})
        self.fields = {k: v for k, v in (fields or {}).items() if v}
        self.max_retries = int(max_retries)
        self.num_requests = self.num_failures = 0

    @property
    def server(self) -> str:
        return self.client.server

    def search(self, queries: list[str], topk: int) -> list[list[SearchHit]]:
        if isinstance(queries, str):
            raise TypeError("queries must be a list of strings, not a single string")
        if not queries:
            return []
        args = [{self.query_arg: q, **({self.topk_arg: int(topk)} if self.topk_arg else {}), **self.extra_args}
                for q in queries]
        last: MCPError | None = None
        for attempt in range(self.max_retries + 1):
            self.num_requests += 1
            try:
                payloads = self.client.call_many(args)
                break
            except MCPError as exc:
                if exc.kind == "no_tool":
                    raise RetrieverUnavailable(f"{exc}; set retriever.tool to one of them") from None
                last = exc
                log.warning("MCP search attempt %d/%d failed: %s", attempt + 1, self.max_retries + 1, exc)
        else:
            self.num_failures += 1
            raise RetrievalError(f"MCP retriever at {self.server} failed after {self.max_retries + 1} attempts; "
                                 f"last error: {last}")
        return [self.documents(p, topk) for p in payloads]

    def documents(self, payload: Any, topk: int) -> list[SearchHit]:
        """One tool result as ranked hits (at most ``topk``)."""
        results = _get(payload, self.fields["results"]) if "results" in self.fields else payload
        if isinstance(results, Mapping) and "results" not in self.fields:
            results = next((results[k] for k in RESULT_LISTS if isinstance(results.get(k), list)), None)
        if not isinstance(results, list):
            raise RetrievalError(f"MCP tool {self.client.tool!r} at {self.server} returned no list of results "
                                 f"(set retriever.fields.results): {str(payload)[:200]}")
        return [self._hit(entry, rank) for rank, entry in enumerate(results[:topk])]

    def _hit(self, entry: Any, rank: int) -> SearchHit:
        if not isinstance(entry, Mapping):
            raise RetrievalError(f"MCP tool {self.client.tool!r} at {self.server}: a result is not an object: "
                                 f"{str(entry)[:200]}")
        f = self.fields
        doc_id = _get(entry, f["id"]) if "id" in f else _first(entry, ID_FIELDS)
        if doc_id is None or isinstance(doc_id, bool) or not str(doc_id).strip():
            raise RetrieverUnavailable(
                f"the MCP server {self.server} returned a result without an id ({str(entry)[:200]}): reports cite "
                "documents as [id], so under reward.citations=retrieved none of them could ever be valid. Name the "
                "id field (retriever.fields.id) or make the tool return one")
        contents = entry.get("contents") if not ({"title", "text"} & set(f)) else None
        if not isinstance(contents, str):
            title = _get(entry, f["title"]) if "title" in f else entry.get("title")
            text = _get(entry, f["text"]) if "text" in f else _first(entry, TEXT_FIELDS)
            text = "" if text is None else str(text)
            contents = f'"{title}"\n{text}' if title else text
        score = _get(entry, f["score"]) if "score" in f else entry.get("score")
        try:
            score = float(score)
        except (TypeError, ValueError):
            score = -float(rank)
        return SearchHit(id=str(doc_id), contents=contents, score=score)

    def close(self) -> None:
        self.client.close()
