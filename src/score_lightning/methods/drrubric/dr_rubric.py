"""``rubric=drrubric``: Deep Research as Rubric (DR-rubric) as a rubric source.

Rubric construction is treated as a research task of its own:

* **Stage I** (research): the writer searches the corpus over several turns (at most ``search_turns`` calls, the
  solver's agent loop) and writes notes: facts a report must get right, the structure it needs, its failure modes;
* **Stage II** (distillation): the writer turns the notes, with the passages its searches returned, into atomic,
  independently verifiable items (the RLER item format), split at ";" and merged by :func:`atomic_items`;
* **bootstrap iterations**: the model under training is its own rubric writer. Iteration ``t`` covers the steps
  ``[(t-1)·iteration_steps, t·iteration_steps)``; the first visit of a query in iteration ``t`` rewrites its rubric
  with the weights trained through iteration ``t-1``. After the last iteration the rubrics stay as written.

The items are scored like RLER's (by the evaluator role or the judge) and give the solver its reward. The writer is not
trained on a rubric reward, as in the paper (``train_writer=true`` adds Stage II's tokens to the evaluator's REINFORCE).
``writer=external`` runs both stages on an OpenAI-compatible model (the paper's frontier-written rubrics), its search
calls answered by the run's retriever. Its queries run concurrently (a thread each, at most the process limiter's
``max_concurrency``, its share of ``judge.max_concurrency``), their searches one at a time (not every retriever is
thread-safe). A write that fails keeps the query's previous items (the harness rubric, counted, when it has none) and
is retried on the next visit; a search that fails is a "retrieval failed" observation, counted
(``rubric/research_retrieval_errors``), as in the policy's agent loop.

Each data-parallel rank writes its own queries' rubrics, so the ``rubric/*`` scalars are pooled over ranks (sums and
counts summed, then divided) before they are logged as the step's: every rank calls :meth:`step_rubrics` in lockstep.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from score_lightning import distributed as D
from score_lightning import protocol as P
from score_lightning.retrieval.base import RetrievalError
from score_lightning.roles.evidence import EvidenceDoc
from score_lightning.roles.rubric import fallback_rubric
from score_lightning.rollout.agent import AgentConfig, parse_search_action, run_agent
from score_lightning.rollout.chat import encode_chat
from score_lightning.step.rubric_source import RubricContext
from score_lightning.methods.rler.item_writer import external_writer, generate_items
from score_lightning.methods.rler.items import Item, checked_items, items_rubric, parse_items
from score_lightning.methods.rler.research_prompts import (
    FINDINGS_CLOSE, atomic_items, distil_messages, findings_text, observed_passages, research_messages,
)
from score_lightning.step.types import RubricSample, StepRubric

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class _Written:
    items: list[Item]
    iteration: int  # the bootstrap iteration whose writer wrote them
    searches: int  # Stage I's search calls


@dataclass
class _Research:
    findings: str
    passages: str
    searches: int
    failed: bool = False  # the external writer's Stage I call failed (counted; Stage II still runs on the passages)
    retrieval_errors: int = 0  # searches whose retrieval failed (a "retrieval failed" observation, counted)


def bootstrap_iteration(step: int, iterations: int, iteration_steps: int) -> int:
    """The 1-based bootstrap iteration of SCORE step ``step`` (0-based); the last one lasts to the end of the run."""
    if iterations <= 1 or iteration_steps <= 0:
        return 1
    return min(iterations, step // iteration_steps + 1)


@dataclass
class DeepResearchRubrics:
    search_turns: int = 3  # Stage I: search calls before the notes
    topk: int = 3  # results per search
    max_observation_tokens: int = 96  # each observation, cut to this many tokens
    max_research_tokens: int = 384  # Stage I: the writer's own tokens (observations come on top)
    num_items: int = 5  # Stage II: items asked for
    max_items: int = 6  # items kept after the atomic split and merge (the heaviest)
    max_item_tokens: int = 256  # Stage II generation budget
    max_findings_chars: int = 1500  # Stage I notes shown to Stage II (bounds its prompt)
    max_passages: int = 6  # passages of Stage I shown to Stage II
    max_passage_chars: int = 200
    iterations: int = 1  # bootstrap iterations (the paper is best at 3)
    iteration_steps: int = 0  # steps per iteration (0: one iteration, rubrics written once per query)
    train_writer: bool = False  # true: Stage II's item tokens join the evaluator's REINFORCE
    writer: str = "evaluator"  # evaluator (the policy writes its own rubrics) | external (an OpenAI-compatible model)
    external: dict | None = None  # ChatClient settings for writer=external
    buffer: dict[str, _Written] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.iterations < 1 or (self.iterations > 1 and self.iteration_steps <= 0):
            raise ValueError(f"rubric.iterations={self.iterations} needs rubric.iteration_steps > 0 (steps per "
                             f"bootstrap iteration), got {self.iteration_steps}")
        if self.train_writer and self.writer == "external":
            raise ValueError("rubric.train_writer=true with rubric.writer=external: an external writer has no tokens "
                             "to train")
        self._client = external_writer(self.writer, self.external)

    @property
    def trains_evaluator(self) -> bool:
        return self.train_writer

    # ------------------------------------------------------------------ before the rollouts
    def step_rubrics(self, ctx: RubricContext, queries: Sequence[str], query_ids: Sequence[str],
                     evidence: Sequence[Sequence[EvidenceDoc]]) -> StepRubric:
        iteration = bootstrap_iteration(ctx.step, self.iterations, self.iteration_steps)
        due = [qi for qi, qid in enumerate(query_ids)
               if str(qid) not in self.buffer or self.buffer[str(qid)].iteration < iteration]
        research = self._research(ctx, [queries[qi] for qi in due])
        prompts = [distil_messages(queries[qi], r.findings[: self.max_findings_chars], r.passages,
                                   self.num_items) for qi, r in zip(due, research)]
        texts, records = self._distil(ctx, prompts)
        written, failed, samples = 0, 0, []
        for qi, r, text, record in zip(due, research, texts, records):
            parsed = parse_items(text)
            items = atomic_items(parsed.items, self.max_items) if parsed.items else []
            if items:
                self.buffer[str(query_ids[qi])] = _Written(items, iteration, r.searches)
                written += len(items)
            failed += int(not items)
            if record is not None and self.train_writer:
                prompt, resp, mask, cut, lps = record
                rubric = items_rubric(items) if items else fallback_rubric(ctx.state)
                samples.append((RubricSample(rubric, bool(items), parsed.error, prompt, resp, mask, cut, lps), [qi]))
        per_query, fallback = [], []
        for qid in query_ids:
            entry = self.buffer.get(str(qid))
            per_query.append(items_rubric(entry.items) if entry else fallback_rubric(ctx.state))
            fallback.append(entry is None)
        sizes = [len(self.buffer[str(q)].items) for q in query_ids if str(q) in self.buffer]
        n = len(research)  # pooled over ranks (collective, in this order on every rank); the iteration is global
        stats = {"rubric/iteration": float(iteration), "rubric/rewritten": D.global_sum(len(due) - failed),
                 "rubric/items_added": D.global_sum(written),
                 "rubric/write_fail_rate": D.pooled_mean(failed, len(due)),
                 "rubric/research_searches": D.pooled_mean(sum(r.searches for r in research), n),
                 "rubric/research_fail_rate": D.pooled_mean(sum(r.failed for r in research), n),
                 "rubric/research_retrieval_errors": D.global_sum(sum(r.retrieval_errors for r in research)),
                 "rubric/buffer_size": D.pooled_mean(sum(sizes), len(sizes))}
        return StepRubric(per_query, samples, not any(fallback), "no rubric items" if any(fallback) else "",
                          stats, fallback)

    def _research(self, ctx: RubricContext, queries: list[str]) -> list[_Research]:
        """Stage I for each query: notes and the passages its searches showed. A collective engine is called even
        with no query (every rank must join)."""
        if self._client is not None:
            lock = threading.Lock()  # one search at a time: the writer's calls overlap, the retriever's need not
            return self._concurrently(lambda q: self._research_external(ctx, q, lock), queries)
        ids = [encode_chat(ctx.tokenizer, research_messages(q), ctx.max_prompt_tokens,
                           key="evaluator.max_prompt_tokens") for q in queries]
        cfg = AgentConfig(max_tool_calls=self.search_turns, max_response_tokens=self.max_research_tokens,
                          max_observation_tokens=self.max_observation_tokens, topk=self.topk,
                          temperature=ctx.temperature, finish_tag=FINDINGS_CLOSE, observations_in_budget=False)
        out = []
        for t in run_agent(ctx.engine, ctx.tokenizer, ids, ctx.retriever, cfg):
            text = ctx.tokenizer.decode(t.response_ids)
            out.append(_Research(findings_text(text), observed_passages(text, self.max_passages,
                                                                        self.max_passage_chars), len(t.search_queries),
                                 retrieval_errors=t.retrieval_errors))
        return out

    def _research_external(self, ctx: RubricContext, query: str, lock: threading.Lock) -> _Research:
        """Stage I on the external writer: each reply either searches (answered by the run's retriever as the next
        user turn, under ``lock``) or writes the notes; past ``search_turns`` it is told to write them. Stage II sees
        the first ``max_passages`` passages, as from the policy writer."""
        messages, shown, searches, errors = research_messages(query), [], 0, 0
        for _ in range(self.search_turns + 1):
            outcome = self._client.ask(messages, _checked_research, expect=f"a search call or {FINDINGS_CLOSE}")
            if not outcome.ok:
                return _Research("", "\n".join(shown[: self.max_passages]), searches, True, errors)
            reply = outcome.value
            if FINDINGS_CLOSE in reply:
                return _Research(findings_text(reply), "\n".join(shown[: self.max_passages]), searches, False, errors)
            action = parse_search_action(reply[: reply.rfind(P.SEARCH_CLOSE) + len(P.SEARCH_CLOSE)])
            searches += 1
            try:
                with lock:
                    hits = ctx.retriever.search([action.query], self.topk)[0] if action.kind == "search" else []
                body = "\n".join(f"[{h.id}] {' '.join(h.text.split())[: self.max_passage_chars]}" for h in hits)
            except RetrievalError:  # the research goes on without this search's results, as the policy's loop does
                errors, body = errors + 1, P.RETRIEVAL_FAILED_OBSERVATION
            else:
                shown.extend(line for line in body.splitlines() if line not in shown)
            last = searches >= self.search_turns
            messages = [*messages, {"role": "assistant", "content": reply},
                        {"role": "user", "content": f"{P.OBS_OPEN}{body or 'No results.'}{P.OBS_CLOSE}"
                                                    + ("\nNo searches left: write your findings now." if last else "")}]
        return _Research("", "\n".join(shown[: self.max_passages]), searches, False, errors)

    def _distil(self, ctx: RubricContext, prompts: list[list[dict]]) -> tuple[list[str], list[tuple | None]]:
        """Stage II item texts, with the evaluator's (prompt ids, response ids, train mask, truncated, log-probs)."""
        if self._client is not None:
            ask = lambda m: self._client.ask(m, checked_items, expect="one <rubric_items> block")  # noqa: E731
            outcomes = self._concurrently(ask, prompts)
            return [o.value if o.ok else "" for o in outcomes], [None] * len(prompts)
        return generate_items(ctx, prompts, self.max_item_tokens)

    def _concurrently(self, call: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """``call`` on every item, in order, from at most the limiter's ``max_concurrency`` threads (the limiter
        bounds the calls in flight; a thread per slot keeps them all busy)."""
        workers = min(len(items), self._client.limiter.max_concurrency)
        if workers <= 1:
            return [call(x) for x in items]
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="drrubric") as pool:
            return list(pool.map(call, items))

    # ------------------------------------------------------------------ after the scoring
    def observe(self, ctx: RubricContext, queries: Sequence[str], query_ids: Sequence[str],
                item_scores: Sequence[Any], reports: Sequence[Sequence[str | None]],
                rewards: Sequence[Sequence[float]],
                passages: Callable[[], list[list[dict[str, str]]]] | None = None) -> dict[str, float]:
        """Nothing to learn from the scores: an iteration's rubrics stay as written until the next iteration."""
        return {}

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return {qid: {"items": [[it.text, it.weight, it.negative] for it in e.items], "iteration": e.iteration,
                      "searches": e.searches} for qid, e in self.buffer.items()}

    def load_state_dict(self, state: dict) -> None:
        self.buffer = {qid: _Written([Item(t, float(w), bool(n)) for t, w, n in e["items"]], int(e["iteration"]),
                                     int(e.get("searches", 0))) for qid, e in state.items()}  # data, not config


def _checked_research(text: str) -> str:
    """An external Stage I reply must search or write the notes (else it is re-asked)."""
    if FINDINGS_CLOSE not in text and P.SEARCH_CLOSE not in text:
        raise ValueError(f"neither a {P.SEARCH_OPEN}…{P.SEARCH_CLOSE} call nor {FINDINGS_CLOSE}")
    return text
