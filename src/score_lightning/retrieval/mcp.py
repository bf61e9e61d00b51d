"""``retriever=mcp``: search through a tool of an MCP server (``scripts/serve_mcp_search.py``, DR Tulu's
``mcp_backend``, any server the official SDK reaches over streamable HTTP or stdio).

Each query is one call of ``retriever.tool`` with ``{query_arg: query, topk_arg: topk, **extra_args}``
(``topk_arg: null`` for a tool without a count; its results are cut to topk here). The result, read in the
shapes servers send (``clients/mcp.py``: structured content, the SDK's ``{"result": "<json>"}`` wrapper, JSON
text, plain text), becomes the ``{id, contents}`` documents the agent loop shows and cites:

* the list of results is ``fields.results`` (a dotted path; null: the payload itself when it is a list, else
  its first list among ``results``, ``documents``, ``data``, ``organic``, ``result``, ``hits``); text alone is
  a list of one;
* a result that is an object: its id is ``fields.id`` (null: the first of ``id``, ``doc_id``, ``docid``,
  ``url``, ``link``); its contents ``contents`` as is, else ``"title"\\ntext`` from ``fields.title``
  (``title``) and ``fields.text`` (the first of ``text``, ``passage``, ``snippet``, ``content``, ``abstract``);
  its score ``fields.score`` (``score``; none: by rank);
* a result that is text (a text block of prose, or a string in the list) is a document whose id is made up
  here, :data:`MADE_UP_ID_PREFIX` and a hash of its text (the same passage has the same id in every search, so
  a report citing it stays grounded); the first is logged as a warning, and ``num_made_up_ids`` counts them.

An object without an id is refused (:class:`~score_lightning.errors.RetrieverUnavailable`, naming the server):
reports cite documents as ``[id]``, so no report citing from it could ever be grounded. A payload with no list
of results, or a result that is neither an object nor text, is an
:class:`~score_lightning.retrieval.base.UnexpectedResult` that shows its shape (:func:`shape`), not retried.
Faults are per query: a failed call is retried ``max_retries`` times (reconnecting when the session broke);
the queries that still fail raise a :class:`~score_lightning.retrieval.base.RetrievalError` that carries the
others' hits, so the agent loop gives only them a "retrieval failed" observation and counts only them.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from score_lightning.clients.mcp import MCPError, MCPToolClient
from score_lightning.errors import RetrieverUnavailable
from score_lightning.retrieval.base import RetrievalError, SearchHit, UnexpectedResult

log = logging.getLogger(__name__)

RESULT_LISTS = ("results", "documents", "data", "organic", "result", "hits")
ID_FIELDS = ("id", "doc_id", "docid", "url", "link")
TEXT_FIELDS = ("text", "passage", "snippet", "content", "abstract")
#: the id of a result that came as text without one: this prefix and the first 12 hex digits of its text's sha1
MADE_UP_ID_PREFIX = "mcp-text-"


def made_up_id(text: str) -> str:
    """A text result's id, the same for the same text in every search (citations of it stay grounded)."""
    return MADE_UP_ID_PREFIX + hashlib.sha1(text.encode("utf-8")).hexdigest()[:12]


def shape(value: Any, depth: int = 3) -> str:
    """A payload's shape for an error message, its keys and types without its contents:
    ``{answer: str, meta: {n: int}}``, ``[3 × {link: str}]``."""
    if isinstance(value, Mapping):
        if depth <= 0:
            return "{…}"
        keys = list(value)[:8]
        inner = ", ".join(f"{k}: {shape(value[k], depth - 1)}" for k in keys)
        return "{" + inner + (", …" if len(value) > len(keys) else "") + "}"
    if isinstance(value, list):
        return "[]" if not value else f"[{len(value)} × {shape(value[0], depth)}]"  # its first item's shape
    if value is None:
        return "null"
    return "str" if isinstance(value, str) else type(value).__name__


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
        self.num_requests = self.num_failures = self.num_made_up_ids = 0

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
        hits: list[list[SearchHit] | None] = [None] * len(queries)
        errors: dict[int, Exception] = {}
        todo = list(range(len(queries)))
        for attempt in range(self.max_retries + 1):
            if not todo:
                break
            self.num_requests += 1
            try:
                outcomes = self.client.call_many([args[i] for i in todo])
            except MCPError as exc:  # no call could be made
                if exc.kind == "no_tool":
                    raise RetrieverUnavailable(f"{exc}; set retriever.tool to one of them") from None
                outcomes = [exc] * len(todo)
            retry = []
            for i, outcome in zip(todo, outcomes):
                try:
                    hits[i] = self._read(outcome, topk)
                except UnexpectedResult as exc:  # the same server sends the same shape: not retried
                    errors[i] = exc
                except MCPError as exc:
                    errors[i] = exc
                    retry.append(i)
            if retry:
                log.warning("MCP search attempt %d/%d: %d of %d calls failed; first: %s", attempt + 1,
                            self.max_retries + 1, len(retry), len(todo), errors[retry[0]])
            todo = retry
        failed = [i for i, h in enumerate(hits) if h is None]
        if not failed:
            return hits  # type: ignore[return-value]
        self.num_failures += len(failed)
        kinds = Counter(getattr(errors[i], "kind", "unexpected_result") for i in failed)
        raise (UnexpectedResult if set(kinds) == {"unexpected_result"} else RetrievalError)(
            f"{len(failed)} of {len(queries)} queries failed ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))}"
            f"{'' if set(kinds) == {'unexpected_result'} else f'; calls retried up to {self.max_retries} times'}): "
            f"{errors[failed[0]]}", hits=hits)

    def _read(self, outcome: Any, topk: int) -> list[SearchHit]:
        """One call's outcome as hits; raises its :class:`MCPError`, or :class:`UnexpectedResult`."""
        if isinstance(outcome, MCPError):
            if outcome.kind == "bad_result":
                raise UnexpectedResult(str(outcome))
            raise outcome
        return self.documents(outcome, topk)

    def documents(self, payload: Any, topk: int) -> list[SearchHit]:
        """One tool result as ranked hits (at most ``topk``)."""
        results = _get(payload, self.fields["results"]) if "results" in self.fields else payload
        if isinstance(results, Mapping) and "results" not in self.fields:
            results = next((results[k] for k in RESULT_LISTS if isinstance(results.get(k), list)), None)
        if isinstance(results, str):  # one text block: one document
            results = [results]
        if not isinstance(results, list):
            where = (f"retriever.fields.results={self.fields['results']}" if "results" in self.fields else
                     f"the payload, or its first list among {', '.join(RESULT_LISTS)}")
            raise UnexpectedResult(
                f"MCP tool {self.client.tool!r} at {self.server} answered with a payload of shape {shape(payload)}, "
                f"with no list of results at {where}: set retriever.fields.results to the dotted path of its list "
                "of results, or make the tool return a list (of objects with an id, or of text)")
        results = [r for r in results if not (isinstance(r, str) and not r.strip())]
        return [self._hit(entry, rank) for rank, entry in enumerate(results[:topk])]

    def _hit(self, entry: Any, rank: int) -> SearchHit:
        if isinstance(entry, str):
            return self._text_hit(entry, rank)
        if not isinstance(entry, Mapping):
            raise UnexpectedResult(f"MCP tool {self.client.tool!r} at {self.server}: a result of shape "
                                   f"{shape(entry)} is neither an object nor text: {str(entry)[:200]}")
        f = self.fields
        doc_id = _get(entry, f["id"]) if "id" in f else _first(entry, ID_FIELDS)
        if doc_id is None or isinstance(doc_id, bool) or not str(doc_id).strip():
            raise RetrieverUnavailable(
                f"the MCP server {self.server} returned a result without an id ({str(entry)[:200]}): reports cite "
                "documents as [id], so under reward.citations=retrieved none of them could ever be valid. Name the "
                "id field (retriever.fields.id) or make the tool return one")
        contents = entry.get("contents") if not ({"title", "text"} & set(f)) else None
        if not isinstance(contents, str):
            title = _get(entry, f["title"]) if "title" in f else entry.get("title")  # data, not config
            text = _get(entry, f["text"]) if "text" in f else _first(entry, TEXT_FIELDS)
            text = "" if text is None else str(text)
            contents = f'"{title}"\n{text}' if title else text
        score = _get(entry, f["score"]) if "score" in f else entry.get("score")  # data, not config
        try:
            score = float(score)
        except (TypeError, ValueError):
            score = -float(rank)
        return SearchHit(id=str(doc_id), contents=contents, score=score)

    def _text_hit(self, text: str, rank: int) -> SearchHit:
        """A result that came as text, without an id: one document, its id made up (and said so, once)."""
        if not self.num_made_up_ids:
            log.warning("MCP tool %r at %s returns text without ids: each text result is a document whose id is "
                        "made up here (%s followed by a hash of its text)", self.client.tool, self.server,
                        MADE_UP_ID_PREFIX)
        self.num_made_up_ids += 1
        return SearchHit(id=made_up_id(text), contents=text, score=-float(rank))

    def close(self) -> None:
        self.client.close()
