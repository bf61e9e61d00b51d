"""An LLM judge over any OpenAI-compatible chat-completions endpoint: writing quality and citations.

**(a) Writing quality.** One request per article. Following the RACE description of DeepResearch
Bench, the judge reads the task and the article and scores four dimensions, each 0–10 with a
reason: comprehensiveness, insight, instruction_following, readability. Unlike RACE it scores the
article on its own (no reference article, no task-specific criteria weights), so the numbers are
*not* comparable to RACE scores (see ``docs/EVALUATION.md``).

**(b) Citations.** The article is split into sentences (a sentence made only of citation markers
joins the one before it); each sentence that cites ``[doc_id]`` is a cited statement. For each
distinct (statement, doc_id) pair of an article:

* a doc_id that the solver never retrieved is **unsupported**, without asking the judge;
* otherwise the judge reads the statement (citation markers removed) and the retrieved passage
  (from the sources file) and answers ``supported`` / ``unsupported`` / ``unknown``.

Valid-citation ratio = supported / (supported + unsupported). ``unknown`` (the judge cannot tell
from the passage) and missing verdicts are excluded from the denominator and reported with their
counts; ``valid_citation_ratio_strict`` = supported / (supported + unsupported + unknown) is given
too. When an article has no entry in the sources file its citations cannot be checked and are
counted as missing (``no_sources_entry``).

**Failures.** Requests go through the official ``openai`` SDK
(:class:`~score_lightning.clients.chat.ChatClient`): it retries a timeout, a connection error and
HTTP 408/409/429/5xx ``max_retries`` times with its own backoff; other 4xx statuses are not
retried. A reply that does not parse into the expected JSON, is cut at ``max_tokens`` or is not a
chat completion is asked again (with the reason) up to ``max_retries`` times. A request that still
fails is recorded as *missing* with its error kind: missing results are left out of every mean and
ratio and counted in the report, never scored 0.
"""

from __future__ import annotations

import json
import logging
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from score_lightning.clients.chat import ChatClient, ChatOutcome, ReplyError, extract_json_object
from score_lightning.methods.judge.citation_claims import cited_statements, split_statements  # noqa: F401 (re-exported)
from score_lightning.rewards.citations import strip_citations, ungrounded_ids

log = logging.getLogger(__name__)

QUALITY_DIMENSIONS: tuple[str, ...] = ("comprehensiveness", "insight", "instruction_following", "readability")
DIMENSION_DEFINITIONS: dict[str, str] = {
    "comprehensiveness": "covers every part of the task with adequate breadth and depth; key aspects, "
                         "perspectives and relevant facts are present, nothing important is missing",
    "insight": "goes beyond restating sources: analysis, causes and consequences, comparisons, "
               "trade-offs and well-founded conclusions or recommendations",
    "instruction_following": "answers exactly what the task asks, respecting its scope, constraints, "
                             "requested form and language",
    "readability": "clear structure and flow, precise language, appropriate use of headings, lists or "
                   "tables; easy for the intended reader to follow and act on",
}
VERDICTS: tuple[str, ...] = ("supported", "unsupported", "unknown")

QUALITY_SYSTEM = (
    "You are a strict, experienced reviewer of deep-research reports. You are given a research task "
    "and the report an assistant wrote for it. Judge the report against what this particular task "
    "demands, dimension by dimension:\n"
    + "\n".join(f"- {d}: {DIMENSION_DEFINITIONS[d]}." for d in QUALITY_DIMENSIONS)
    + "\nFor each dimension first decide what an excellent report for this task would need, then "
    "compare the report with that. Score each dimension with an integer from 0 (absent or useless) "
    "to 10 (could not reasonably be better); 5 means adequate but clearly improvable. Judge only "
    "what is written; length alone earns nothing. Square-bracketed ids such as [doc_id] are citation "
    "markers for documents the assistant retrieved.\n"
    "Reply with one JSON object and nothing else, in exactly this form:\n"
    '{"comprehensiveness": {"score": 0, "reason": "..."}, "insight": {"score": 0, "reason": "..."}, '
    '"instruction_following": {"score": 0, "reason": "..."}, "readability": {"score": 0, "reason": "..."}}'
)

CITATION_SYSTEM = (
    "You check citations. You are given a statement from a research report and the text of the "
    "source document it cites. Decide whether the source supports the statement:\n"
    "- supported: the source states or clearly implies the statement's claim;\n"
    "- unsupported: the source does not contain the claim, or contradicts it;\n"
    "- unknown: the source text is unreadable or too incomplete to decide.\n"
    "Use only the source text, not your own knowledge. Reply with one JSON object and nothing else: "
    '{"verdict": "supported" | "unsupported" | "unknown", "reason": "one sentence"}'
)


def quality_messages(prompt: str, article: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": QUALITY_SYSTEM},
        {"role": "user", "content": f"<task>\n{prompt.strip()}\n</task>\n\n<report>\n{article.strip()}\n</report>"},
    ]


def citation_messages(statement: str, doc_id: str, title: str | None, text: str) -> list[dict[str, str]]:
    head = f"{doc_id}: {title}" if title else doc_id
    return [
        {"role": "system", "content": CITATION_SYSTEM},
        {"role": "user", "content": f"<statement>\n{statement.strip()}\n</statement>\n\n"
                                    f"<source id=\"{head}\">\n{text.strip()}\n</source>"},
    ]


# ---------------------------------------------------------------------------------------- parsing
def _score(value: Any, dim: str) -> float:
    if isinstance(value, dict):
        value = value.get("score")  # data, not config
    if isinstance(value, bool) or value is None:
        raise ReplyError(f"{dim}: no numeric score")
    try:
        score = float(value)
    except (TypeError, ValueError):
        raise ReplyError(f"{dim}: score {value!r} is not a number") from None
    if not math.isfinite(score) or not 0.0 <= score <= 10.0:
        raise ReplyError(f"{dim}: score {score} outside 0-10")
    return score


def parse_quality_reply(text: str) -> dict[str, dict[str, Any]]:
    """``{dim: {"score", "reason"}}`` for all four dimensions, else :class:`ReplyError` (all or nothing)."""
    obj = extract_json_object(text)
    if isinstance(obj.get("scores"), dict):  # tolerate {"scores": {...}}
        obj = obj["scores"]
    lowered = {str(k).strip().lower().replace(" ", "_").replace("-", "_"): v for k, v in obj.items()}
    out = {}
    for dim in QUALITY_DIMENSIONS:
        if dim not in lowered:
            raise ReplyError(f"missing dimension {dim}")
        entry = lowered[dim]
        reason = entry.get("reason", "") if isinstance(entry, dict) else ""  # data, not config
        out[dim] = {"score": _score(entry, dim), "reason": str(reason)}
    return out


def parse_citation_reply(text: str) -> dict[str, str]:
    obj = extract_json_object(text)
    verdict = str(obj.get("verdict", "")).strip().lower()
    if verdict not in VERDICTS:
        raise ReplyError(f"verdict {obj.get('verdict')!r} is not one of {list(VERDICTS)}")
    return {"verdict": verdict, "reason": str(obj.get("reason", ""))}  # data, not config


# ---------------------------------------------------------------------------------------- client
Outcome = ChatOutcome  # a judge request's result: value, or error kind + detail; attempts = HTTP requests


class JudgeClient(ChatClient):
    """The judge's OpenAI-compatible endpoint: the shared SDK client with the judge's defaults.

    Transport retries use the openai SDK's backoff (0.5 s doubling, with jitter, honouring
    ``Retry-After``).
    """

    def __init__(self, base_url: str, model: str, api_key: str | None = None, *, timeout_s: float = 60.0,
                 max_retries: int = 2, temperature: float = 0.0,
                 max_tokens: int | None = 1024) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"--judge-base-url must start with http:// or https://, got {base_url!r}")
        super().__init__(base_url, model, api_key, timeout_s=timeout_s, max_retries=max_retries,
                         temperature=temperature, max_tokens=max_tokens)


# ---------------------------------------------------------------------------------------- files
def read_jsonl(path: str | Path) -> list[dict]:
    out = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                raise ValueError(f"{path}:{lineno}: invalid JSON") from None
            if not isinstance(obj, dict) or "id" not in obj:
                raise ValueError(f"{path}:{lineno}: expected a JSON object with an \"id\"")
            out.append(obj)
    return out


def _source_index(entry: dict) -> tuple[set[str], dict[str, dict]]:
    retrieved = {str(d) for d in entry.get("retrieved_ids", [])}
    texts: dict[str, dict] = {}
    for c in entry.get("citations", []):  # data, not config
        doc_id = str(c.get("doc_id"))
        if c.get("retrieved"):
            retrieved.add(doc_id)
            texts[doc_id] = c
    return retrieved, texts


# ---------------------------------------------------------------------------------------- run
@dataclass
class JudgeOptions:
    quality: bool = True
    citations: bool = True
    concurrency: int = 4
    limit: int | None = None
    max_article_chars: int = 100_000
    max_source_chars: int = 8_000


def _article_tasks(article: dict, sources: dict[str, dict] | None, opts: JudgeOptions):
    """Build the per-article record skeleton and the judge calls it needs."""
    text = str(article.get("article") or "")
    rec: dict[str, Any] = {"id": article["id"]}
    calls: list[tuple[str, Any, list[dict], Callable]] = []  # (kind, slot, messages, parser)
    if opts.quality:
        rec.update(quality=None, quality_error=None)
        body = text[: opts.max_article_chars] if opts.max_article_chars else text
        rec["article_truncated_for_judge"] = len(body) < len(text)
        calls.append(("quality", None, quality_messages(str(article.get("prompt", "")), body), parse_quality_reply))
    rec["citations"] = []
    if opts.citations:
        rec["has_sources"] = sources is not None
        retrieved, texts = _source_index(sources) if sources is not None else (set(), {})
        pairs = cited_statements(text, retrieved)
        never = set(ungrounded_ids([doc_id for _, doc_id in pairs], retrieved))
        for statement, doc_id in pairs:
            c: dict[str, Any] = {"doc_id": doc_id, "statement": statement, "verdict": None, "reason": "",
                                 "judged": False, "error": None}
            rec["citations"].append(c)
            if sources is None:
                c["error"] = "no_sources_entry"
            elif doc_id in never:
                c.update(verdict="unsupported", reason="cited document was never retrieved", never_retrieved=True)
            elif not (texts.get(doc_id) or {}).get("text"):  # data, not config
                c["error"] = "no_source_text"
            else:
                src = texts[doc_id]
                body = str(src["text"])[: opts.max_source_chars] if opts.max_source_chars else str(src["text"])
                title = src.get("title")  # data, not config
                msgs = citation_messages(strip_citations(statement, retrieved), doc_id, title, body)
                calls.append(("citation", c, msgs, parse_citation_reply))
    return rec, calls


def run_judge(articles_path: str | Path, sources_path: str | Path | None, client: JudgeClient,
              opts: JudgeOptions | None = None, progress: bool = False) -> list[dict]:
    """Judge every article; returns one record per article (quality scores, citation verdicts, errors)."""
    from tqdm.auto import tqdm

    opts = opts or JudgeOptions()
    articles = read_jsonl(articles_path)
    if opts.limit is not None:
        articles = articles[: max(opts.limit, 0)]
    sources: dict[str, dict] | None = None
    if opts.citations:
        if sources_path is None or not Path(sources_path).exists():
            raise FileNotFoundError(f"sources file not found: {sources_path} (use --no-citations to skip the check)")
        sources = {}
        for entry in read_jsonl(sources_path):
            if int(entry.get("sample", 0)) == 0:  # the article file holds sample 0 (generate --samples)
                sources[str(entry["id"])] = entry  # the last entry of an id wins (as in generation)
    records, calls = [], []
    for art in articles:
        rec, art_calls = _article_tasks(art, sources.get(str(art["id"])) if sources is not None else None, opts)
        records.append(rec)
        calls.extend((rec, *call) for call in art_calls)

    bar = tqdm(total=len(calls), desc="judge", unit="request", disable=not progress)

    def work(call):
        rec, kind, slot, msgs, parser = call
        outcome = client.ask(msgs, parser)
        bar.update(1)
        return call, outcome

    try:
        with ThreadPoolExecutor(max_workers=max(1, opts.concurrency)) as pool:
            for (rec, kind, slot, _, _), outcome in pool.map(work, calls):
                if kind == "quality":
                    rec["quality"] = outcome.value if outcome.ok else None
                    rec["quality_error"] = outcome.error
                    rec["quality_attempts"] = outcome.attempts
                else:
                    slot["judged"] = True
                    slot["attempts"] = outcome.attempts
                    if outcome.ok:
                        slot.update(verdict=outcome.value["verdict"], reason=outcome.value["reason"])
                    else:
                        slot["error"] = outcome.error
    finally:
        bar.close()
    return records
