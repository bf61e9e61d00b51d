"""Judge articles against DeepResearch Bench II's rubrics over an OpenAI-compatible endpoint.

Each article (``{"id", "prompt", "article"}``) is matched to the DRB-II task with the same ``id``
(``str(id)`` equals the task's ``id``, e.g. ``task7``). Its rubric items, in DRB-II's order
(info_recall, analysis, presentation), are cut into batches of ``chunk_size`` (DRB-II's default 50)
and each batch is one judge request with the whole article (:mod:`.drb2_prompt`). The requests of
all articles share one pool of ``concurrency`` workers. Retries are the judge client's: the
``openai`` SDK's for transport errors, re-asking for an unparseable or incomplete reply; a batch that
still fails leaves its items missing and the article unscored (:mod:`.drb2_score`).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from score_lightning.evaluation.drb2_prompt import batch_messages, parse_batch_reply
from score_lightning.evaluation.drb2_score import article_record, unmatched_record
from score_lightning.data.drb2_tasks import Drb2Task
from score_lightning.clients.chat import ChatClient

log = logging.getLogger(__name__)


@dataclass
class Drb2Options:
    chunk_size: int = 50
    concurrency: int = 4
    max_article_chars: int = 150_000  # DRB-II's MAX_PAPER_CHARS; 0 = all


def match_articles(articles: list[dict], tasks: dict[str, Drb2Task]) -> list[Drb2Task | None]:
    """The task of each article by id (None for none); refuses a file where no article matches."""
    found = [tasks.get(str(a.get("id"))) for a in articles]  # data, not config
    if articles and not any(found):
        shown = [a.get("id") for a in articles[:3]]  # data, not config
        raise ValueError(f"no article id matches a DeepResearch Bench II task id (articles: "
                         f"{shown}, tasks: {list(tasks)[:3]}); generate with "
                         "--queries <tasks_and_rubrics.jsonl> so the articles carry the task ids")
    unmatched = [a.get("id") for a, t in zip(articles, found) if t is None]  # data, not config
    if unmatched:
        log.warning("%d articles match no DeepResearch Bench II task id (e.g. %r); they are counted, not scored",
                    len(unmatched), unmatched[0])
    return found


def run_drb2(articles: list[dict], tasks: dict[str, Drb2Task], client: ChatClient,
             opts: Drb2Options | None = None, progress: bool = False,
             matched: list[Drb2Task | None] | None = None) -> list[dict[str, Any]]:
    """One ``drb2`` record per article, in the articles' order (:func:`.drb2_score.article_record`);
    ``matched``: :func:`match_articles`'s answer, when the caller already has it."""
    from tqdm.auto import tqdm

    opts = opts or Drb2Options()
    matched = match_articles(articles, tasks) if matched is None else matched
    calls: list[tuple[int, int, Drb2Task, list[str], list[dict[str, str]]]] = []
    bodies: dict[int, tuple[str, bool]] = {}
    for i, (art, task) in enumerate(zip(articles, matched)):
        if task is None:
            continue
        text = str(art.get("article") or "")
        body = text[: opts.max_article_chars] if opts.max_article_chars else text
        bodies[i] = (body, len(body) < len(text))
        for b, items in enumerate(task.batches(opts.chunk_size)):
            calls.append((i, b, task, items, batch_messages(task, items, body)))

    bar = tqdm(total=len(calls), desc="judge drb2", unit="request", disable=not progress)

    def work(call):
        _, _, _, items, msgs = call
        outcome = client.ask(msgs, lambda text: parse_batch_reply(text, items))
        bar.update(1)
        return call, outcome

    answers: dict[int, dict[str, dict[str, Any]]] = {i: {} for i in bodies}
    batches: dict[int, list[dict[str, Any]]] = {i: [] for i in bodies}
    try:
        with ThreadPoolExecutor(max_workers=max(1, opts.concurrency)) as pool:
            for (i, b, _, items, _), outcome in pool.map(work, calls):
                batches[i].append({"batch": b, "items": len(items), "error": outcome.error,
                                   "detail": outcome.detail[:300], "attempts": outcome.attempts})
                if outcome.ok:
                    answers[i].update(outcome.value)
    finally:
        bar.close()
    out: list[dict[str, Any]] = []
    for i, (art, task) in enumerate(zip(articles, matched)):
        if task is None:
            out.append(unmatched_record(art.get("id")))  # data, not config
        else:
            out.append({"article_id": art.get("id"),  # data, not config
                        **article_record(task, answers[i], batches[i], truncated=bodies[i][1])})
    return out
