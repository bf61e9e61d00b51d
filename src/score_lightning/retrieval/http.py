"""Client for Search-R1-style ``POST /retrieve`` servers (ours in ``server.py``, or Search-R1's own).

Transient failures (timeouts, refused connections, 5xx, garbled JSON) are retried with exponential
backoff, because one flaky request should not kill a multi-hour run; client errors (4xx) are bugs
in the request and fail at once. The retry loop is ``tenacity``'s (not urllib3's ``Retry``, which
cannot retry a 200 whose body is garbled and whose backoff base is fixed at 2); this module only
says what is retryable (:class:`_Retryable`) and counts attempts.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import requests
import tenacity

from score_lightning.errors import RetrieverUnavailable
from score_lightning.retrieval.base import RetrievalError, SearchHit

log = logging.getLogger(__name__)


class _Retryable(Exception):
    """A failure worth another attempt."""


def _parse_entry(entry: Any) -> SearchHit:
    """Accept ``{"document": {"id","contents"}, "score": s}`` and plain ``{"id","contents"}``."""
    if not isinstance(entry, dict):
        raise ValueError(f"result entry must be an object, got {type(entry).__name__}")
    doc = entry["document"] if "document" in entry else entry
    score = entry.get("score", 0.0)  # data, not config
    if not isinstance(doc, dict) or "contents" not in doc:
        raise ValueError(f"result entry has no document contents: {str(entry)[:200]}")
    doc_id = doc.get("id")  # data, not config
    if doc_id is None or isinstance(doc_id, bool) or not str(doc_id).strip():
        raise _NoId(f"result entry has no document id: {str(entry)[:200]}")
    return SearchHit(id=str(doc_id), contents=str(doc["contents"]), score=float(score))


class _NoId(ValueError):
    """A hit without an id: the server answers, but every report citing from it could never be grounded."""


class HTTPRetriever:
    """Remote retriever speaking the Search-R1 ``/retrieve`` API.

    ``num_requests`` counts HTTP attempts (each retry is one); ``num_failures`` counts ``search``
    calls that raised after the retries, for logging the backend's health.
    """

    def __init__(self, url: str, timeout_s: float = 10.0, max_retries: int = 3,
                 backoff_s: float = 0.25, backoff_factor: float = 2.0, token: str | None = None,
                 token_env: str = "SCORE_RETRIEVER_TOKEN") -> None:
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"retriever.url must start with http:// or https://, got {url!r}")
        self.url = url
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.backoff_factor = float(backoff_factor)
        self.num_requests = 0
        self.num_failures = 0
        self._session = requests.Session()
        # Bearer token for a server started with one: ``token``, else ``$token_env``; empty = none.
        self.token_env = token_env
        token = token if token is not None else os.environ.get(token_env)
        if token:
            self._session.headers["Authorization"] = f"Bearer {token}"
        self._sleep = time.sleep  # replaceable in tests

    def _attempt(self, payload: dict, n_queries: int) -> list[list[SearchHit]]:
        self.num_requests += 1
        try:
            resp = self._session.post(self.url, json=payload, timeout=self.timeout_s)
        except (requests.Timeout, requests.ConnectionError, requests.exceptions.ChunkedEncodingError,
                requests.exceptions.ContentDecodingError) as exc:
            raise _Retryable(f"{type(exc).__name__}: {exc}") from exc
        if resp.status_code >= 500:
            raise _Retryable(f"HTTP {resp.status_code}: {resp.text[:200]}")
        if resp.status_code == 401:
            raise RetrievalError(f"retriever at {self.url} answered HTTP 401 unauthorized: set {self.token_env} "
                                 f"to the server's token (not retried): {resp.text[:200]}")
        if resp.status_code >= 400:
            raise RetrievalError(
                f"retriever at {self.url} rejected the request with HTTP {resp.status_code} "
                f"(not retried): {resp.text[:300]}"
            )
        try:
            body = resp.json()
            result = body["result"]
            if not isinstance(result, list) or len(result) != n_queries:
                raise ValueError(f'"result" must be a list of {n_queries} lists')
            return [[_parse_entry(e) for e in hits] for hits in result]
        except _NoId as exc:  # not retried, not an outage to ride out: the server's corpus or protocol is wrong
            raise RetrieverUnavailable(
                f"the retriever at {self.url} returned a hit without an id ({exc}): reports cite documents as [id], "
                "so under reward.citations=retrieved none of them could ever be valid. Serve a corpus whose "
                "lines carry an \"id\" (JSONL {\"id\", \"contents\"}) or fix the server's response") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise _Retryable(f"malformed response ({exc}): {resp.text[:200]}") from exc

    def search(self, queries: list[str], topk: int) -> list[list[SearchHit]]:
        if isinstance(queries, str):
            raise TypeError("queries must be a list of strings, not a single string")
        if not queries:
            return []
        payload = {"queries": list(queries), "topk": int(topk), "return_scores": True}
        attempts = self.max_retries + 1
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(_Retryable),
            stop=tenacity.stop_after_attempt(attempts),
            wait=tenacity.wait_exponential(multiplier=self.backoff_s, exp_base=self.backoff_factor, min=0.0),
            sleep=lambda seconds: self._sleep(seconds),  # looked up per call: tests replace _sleep
            before_sleep=lambda state: log.warning(
                "retrieval attempt %d/%d to %s failed: %s", state.attempt_number, attempts, self.url,
                state.outcome.exception() if state.outcome else "?"),
            reraise=True,
        )
        try:
            return retrying(self._attempt, payload, len(queries))
        except _Retryable as exc:
            self.num_failures += 1
            raise RetrievalError(
                f"retriever at {self.url} failed after {attempts} attempts; last error: {exc}") from exc
        except RetrievalError:
            self.num_failures += 1
            raise

    def close(self) -> None:
        self._session.close()
