"""Optional: an OpenAI-compatible model rewords each item's statement into fluent checklist prose.

Only ``text`` changes: ``evidence`` and ``terms`` stay what the builder derived, so the programmatic verifier
decides the same. A rewording must still name the evidence id and every term (a judge that reads the text
must be able to check what the verifier checks); a reply that drops one is re-asked with the reason, and an
item whose rewording still fails keeps its programmatic text and is counted, by error kind.
"""

from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from score_lightning.clients.chat import ChatClient, ReplyError, extract_json_object
from score_lightning.data.items import EvidenceItem, QueryItems
from score_lightning.rewards.items import report_prose, term_present

SYSTEM = ("You rewrite rubric items for grading research reports. Each item is one binary, checkable statement. "
          'Reply with one JSON object {"text": "..."}: a single sentence that keeps the cited id and every key '
          "term verbatim and adds nothing the original does not say.")


def _parse(item: EvidenceItem):
    def parse(reply: str) -> str:
        text = extract_json_object(reply).get("text")  # data, not config
        if not isinstance(text, str) or not text.strip():
            raise ReplyError('the reply needs a non-empty "text"')
        text = " ".join(text.split())
        prose = report_prose(text)
        missing = [t for t in item.terms if not term_present(t, prose)]
        if item.evidence[0] not in text or missing:
            raise ReplyError(f"keep the id {item.evidence[0]} and the terms {missing or list(item.terms)} verbatim")
        return text
    return parse


def reword_items(queries: list[QueryItems], client: ChatClient, max_workers: int = 4) -> tuple[list[QueryItems], dict]:
    """The queries with reworded item texts, and ``{"reworded": n, "failed": n, "errors": {kind: n}}``."""
    jobs = [(qi, j, it) for qi, q in enumerate(queries) for j, it in enumerate(q.items)]

    def ask(job):
        _, _, it = job
        msg = {"role": "user", "content": json.dumps({"item": it.text, "id": it.evidence[0], "terms": list(it.terms)})}
        return client.ask([{"role": "system", "content": SYSTEM}, msg], _parse(it))

    with ThreadPoolExecutor(max_workers=max(1, max_workers)) as pool:
        outcomes = list(pool.map(ask, jobs))
    new = [QueryItems(q.id, q.prompt, list(q.items), dict(q.extra)) for q in queries]
    errors: Counter = Counter()
    for (qi, j, it), out in zip(jobs, outcomes):
        if out.ok:
            new[qi].items[j] = replace(it, text=out.value)
        else:
            errors[out.error] += 1
    return new, {"reworded": len(jobs) - sum(errors.values()), "failed": sum(errors.values()), "errors": dict(errors)}
