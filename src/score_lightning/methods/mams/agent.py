"""The MaMs solver workflow (``solver.agent=mams``): one policy, three roles per turn, bounded contexts.

Turn t of every active trajectory, batched over trajectories:

1. **search** role: ``<search>q</search>`` (a search), ``<finish/>`` (stop), anything else is an
   invalid action (counted, and it uses up a search, as in the ReAct loop);
2. the retriever answers the searches; each observation's text is cut to
   ``max_observation_tokens`` and split into chunks of ``chunk_tokens`` tokens;
3. **state** role, once per chunk: rewrites ``<memory>`` and ``<plan>`` (an invalid state keeps the
   previous one);
4. **report** role: rewrites ``<report>`` from the memory (also once when the search role finishes
   before any report exists). The last report role call is the trajectory's report: an unclosed
   one (cut by ``report_tokens``) marks the trajectory truncated, so its answer is invalid.

Every prompt holds the question, memory, plan, report and at most one chunk, each cut to its budget,
so its length does not grow with the number of turns. Each call's ids are kept exactly as generated
in a :class:`~score_lightning.rollout.trajectory.Segment`. With a collective engine (FSDP-sharded HF
generate) every rank makes the same number of generate calls, with empty prompt lists when it has
nothing left, as in :func:`~score_lightning.rollout.agent.run_agent`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from score_lightning.protocol import SEARCH_CLOSE
from score_lightning.retrieval.base import RetrievalError, Retriever, hits_or_failed
from score_lightning.methods.mams import prompts as M
from score_lightning.rollout.agent import parse_search_action, shown_ids
from score_lightning.rollout.chat import encode_chat, truncate_text
from score_lightning.rollout.engine import RolloutEngine, SamplingParams, is_collective
from score_lightning.rollout.stops import TagStops, completed_tag
from score_lightning.rollout.trajectory import Segment, Trajectory

if TYPE_CHECKING:
    from score_lightning.config.schema import SolverConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MamsConfig:
    """``solver.mams.*`` (token budgets) plus the solver's search budget and sampling settings."""

    max_searches: int = 3
    topk: int = 2
    chunk_tokens: int = 64
    max_observation_tokens: int = 256
    search_tokens: int = 48
    state_tokens: int = 128
    report_tokens: int = 160
    memory_tokens: int = 96
    plan_tokens: int = 32
    max_context_tokens: int = 768
    temperature: float = 1.0
    top_p: float = 1.0
    conclusion_line: bool = True

    @property
    def max_response_tokens(self) -> int:
        """The most tokens one trajectory's role calls can generate, which no single cap bounds: every turn at full
        length (its search call, a state call per chunk of a full observation, its report call). Dr. GRPO's
        constant under MaMs (``optim.loss_type=dr_grpo``); a turn that finishes is shorter."""
        chunks = -(-max(1, self.max_observation_tokens) // max(1, self.chunk_tokens))
        return self.max_searches * (self.search_tokens + chunks * self.state_tokens + self.report_tokens)


def mams_settings(solver: "SolverConfig") -> MamsConfig:
    """MaMs's budgets from the run's ``solver`` node: its own ``solver.mams`` budgets, the solver's search budget and
    sampling (one node holds them all, so the workflow and its cold-start demos read the same values)."""
    m = solver.mams
    keys = ("chunk_tokens", "max_observation_tokens", "search_tokens", "state_tokens", "report_tokens",
            "memory_tokens", "plan_tokens", "max_context_tokens")
    return MamsConfig(int(solver.max_tool_calls), int(solver.topk), **{k: int(m[k]) for k in keys},
                      temperature=float(solver.temperature), top_p=float(solver.top_p),
                      conclusion_line=bool(solver.conclusion_line))


@dataclass
class _Run:
    """One trajectory's Markov state between role calls."""

    traj: Trajectory
    query: str
    rubric: str
    memory: str = ""
    plan: str = ""
    report: str = ""
    search: str = ""
    chunks: list[str] = field(default_factory=list)
    chunk_total: int = 0
    turn: int = 0
    wrote_report: bool = False
    needs_report: bool = False
    done: bool = False


def run_mams(engine: RolloutEngine, tokenizer, queries: Sequence[str], rubrics: Sequence[str],
             retriever: Retriever | None, cfg: MamsConfig, metas: Sequence[dict] | None = None) -> list[Trajectory]:
    """Roll out one MaMs trajectory per (query, rubric text); returns them in order."""
    runs = [_Run(Trajectory(prompt_ids=[], meta={**(dict(metas[i]) if metas else {}), "agent": "mams",
                                                 "context_max": 0, "memory_tokens": []}), q, r)
            for i, (q, r) in enumerate(zip(queries, rubrics))]
    role = _Roles(engine, tokenizer, cfg)
    while role.any([r for r in runs if not r.done]):
        searching = [r for r in runs if not r.done and r.traj.tool_calls < cfg.max_searches]
        for r in runs:
            r.done = r.done or r not in searching  # search budget spent: the report so far is final
        _observe(_search(role, searching, cfg), retriever, cfg, tokenizer)
        while role.any([r for r in runs if r.chunks]):
            _fuse(role, [r for r in runs if r.chunks], cfg, tokenizer)
        _write(role, [r for r in runs if r.needs_report], cfg, tokenizer)
        for r in searching:  # a turn is one search-role call
            r.turn += 1
    for r in runs:
        r.traj.finished = True
        r.traj.meta["turns"] = r.turn
    return [r.traj for r in runs]


def _search(role: "_Roles", runs: list[_Run], cfg: MamsConfig) -> list[_Run]:
    """The search role for ``runs``; returns those that issued a valid search (a step)."""
    outs = role.generate(runs, "search", lambda r: M.search_messages(
        r.query, r.memory, r.plan, r.report, r.traj.tool_calls, cfg.max_searches), cfg.search_tokens,
        [M.FINISH, SEARCH_CLOSE])
    searched = []
    for r, (text, _, tag) in zip(runs, outs):
        if tag == M.FINISH:
            r.done, r.needs_report = True, not r.wrote_report
            continue
        action = parse_search_action(text) if tag == SEARCH_CLOSE else None
        r.traj.tool_calls += 1  # a search or an invalid action, as in the ReAct loop
        if action is not None and action.kind == "search":
            r.traj.search_queries.append(action.query)
            r.traj.segments[-1].step = len(r.traj.search_queries) - 1
            searched.append(r)
        else:
            r.traj.invalid_actions += 1
    return searched


def _fuse(role: "_Roles", runs: list[_Run], cfg: MamsConfig, tokenizer) -> None:
    """The state role on each run's next chunk: the new memory and plan replace the old (if valid)."""
    outs = role.generate(runs, "state", lambda r: M.state_messages(
        r.query, r.search, r.memory, r.plan, r.chunks[0], r.chunk_total - len(r.chunks) + 1, r.chunk_total),
        cfg.state_tokens, [M.PLAN_CLOSE])
    for r, (text, _, _) in zip(runs, outs):
        r.chunks.pop(0)
        parsed = M.parse_state(text)
        if not parsed.valid:
            r.traj.invalid_actions += 1
            continue
        r.memory = truncate_text(tokenizer, parsed.memory, cfg.memory_tokens)
        r.plan = truncate_text(tokenizer, parsed.plan, cfg.plan_tokens)
        r.traj.meta["memory_tokens"].append(len(tokenizer(r.memory, add_special_tokens=False)["input_ids"]))


def _write(role: "_Roles", runs: list[_Run], cfg: MamsConfig, tokenizer) -> None:
    """The report role: the last call's report is the trajectory's (an unclosed, cut one: truncated)."""
    outs = role.generate(runs, "report", lambda r: M.report_messages(
        r.query, r.rubric, r.memory, r.plan, r.report, cfg.conclusion_line), cfg.report_tokens, [M.REPORT_CLOSE])
    for r, (text, cut, _) in zip(runs, outs):
        body = M.parse_report(text)
        r.needs_report, r.wrote_report, r.traj.truncated, r.traj.report = False, True, body is None and cut, body
        if body is not None:
            r.report = truncate_text(tokenizer, body, cfg.report_tokens)
        elif not cut:
            r.traj.invalid_actions += 1


class _Roles:
    """Batched role calls: encode each run's bounded prompt, generate, record the segment."""

    def __init__(self, engine: RolloutEngine, tokenizer, cfg: MamsConfig):
        self.engine, self.tok, self.cfg = engine, tokenizer, cfg
        self.lockstep = is_collective(engine)

    def any(self, runs: list[_Run]) -> bool:
        """Whether another round is needed; with a collective engine, while *any* rank has work."""
        if not self.lockstep:
            return bool(runs)
        from score_lightning import distributed as D

        return D.global_max(len(runs)) > 0

    def generate(self, runs: list[_Run], role: str, messages: Callable[[_Run], list[dict]], budget: int,
                 tags: list[str]) -> list[tuple[str, bool, str | None]]:
        """One generate call for ``runs`` in ``role``; per run: the decoded output, whether the budget cut
        it (no tag, no end-of-turn), and the tag it stopped on."""
        stops = TagStops(self.tok, tags)
        params = SamplingParams(max_new_tokens=budget, temperature=self.cfg.temperature, top_p=self.cfg.top_p,
                                stop_token_ids=stops.token_ids, stop_strings=stops.strings)
        if not runs:
            if self.lockstep:  # join the other ranks' collective call
                self.engine.generate([], SamplingParams(max_new_tokens=1, stop_token_ids=stops.token_ids))
            return []
        prompts = [encode_chat(self.tok, messages(r), self.cfg.max_context_tokens) for r in runs]
        gens = self.engine.generate(prompts, params)
        out = []
        for r, prompt, gen in zip(runs, prompts, gens):
            ids = list(gen.token_ids)[:budget]
            lps = list(gen.logprobs)[:budget] if gen.logprobs is not None else [math.nan] * len(ids)  # none recorded
            if not r.traj.prompt_ids:
                r.traj.prompt_ids = list(prompt)
            r.traj.add_segment(Segment(role, r.turn, list(prompt), ids, [1] * len(ids), lps))
            r.traj.meta["context_max"] = max(r.traj.meta["context_max"], len(prompt))
            found = completed_tag(ids, self.tok.decode, tags) if ids else None
            cut = found is None and bool(ids) and ids[-1] not in stops.end_ids
            out.append((self.tok.decode(ids), cut, found[0] if found is not None else None))
        return out


def _observe(runs: list[_Run], retriever: Retriever | None, cfg: MamsConfig, tokenizer) -> None:
    """Answer every pending search in one retriever call; queue each observation's chunks for the state role."""
    if not runs:
        return
    hits: list[list | None] = [None for _ in runs]
    if retriever is not None:
        try:
            hits = retriever.search([r.traj.search_queries[-1] for r in runs], cfg.topk)
        except RetrievalError as exc:  # the searches that did get hits keep them; only the failed ones count
            hits = hits_or_failed(exc, len(runs))
            log.warning("retrieval failed for %d of %d MaMs searches: %s", hits.count(None), len(runs), exc)
    for r, found in zip(runs, hits):
        failed, found = found is None, found or []
        r.search = r.traj.search_queries[-1]
        if failed:
            r.traj.retrieval_errors += 1
        body = "\n".join(f"[{h.id}] {h.text}" for h in found) if found else "No results."
        r.chunks = chunk_text(tokenizer, body if not failed else "Retrieval failed.", cfg.chunk_tokens,
                              cfg.max_observation_tokens)
        doc_ids = shown_ids(found, "".join(r.chunks)) if not failed else []  # retrieved = shown to the state role
        r.traj.step_doc_ids.append(doc_ids)
        r.traj.step_passages.append("".join(r.chunks) if not failed else "")
        r.traj.retrieved_ids.extend(d for d in doc_ids if d not in r.traj.retrieved_ids)
        r.chunk_total = len(r.chunks)
        r.needs_report = True


def chunk_text(tokenizer, text: str, chunk_tokens: int, max_tokens: int) -> list[str]:
    """``text``'s first ``max_tokens`` tokens as consecutive pieces of at most ``chunk_tokens`` tokens."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][: max(1, max_tokens)]
    step = max(1, chunk_tokens)
    return [tokenizer.decode(ids[i:i + step]) for i in range(0, len(ids), step)] or [""]
