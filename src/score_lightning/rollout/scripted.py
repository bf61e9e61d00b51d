"""A rollout engine that replays chosen responses: the tool for testing the training step on real rewards.

A randomly initialised model never writes a valid report, so every reward is 0 and the path
reward -> advantage -> update is never exercised. :class:`ScriptedEngine` implements
:class:`~score_lightning.rollout.engine.RolloutEngine` and answers each generation request with the
text (or token ids) a *responder* chooses for it, cut by the request's stops and budget exactly as
a sampler would be. Trajectories keep those token ids, the trainer recomputes their log-probs with
the real model, and GRPO / REINFORCE update the real weights: only the sampling is scripted.

The responder sees a :class:`ScriptRequest`: which prompt (rubric, solver or scoring), the query,
which of the identical prompts of the batch this is (the rollout index k), the turn number and the
decoded context so far (including observations), so a script can cite what was retrieved.
:class:`ProtocolResponder` is a deterministic script that writes valid rubrics, cited reports of
varying quality and scoring XML with one verification search (``rollout=scripted``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from score_lightning import protocol as P
from score_lightning.rewards.citations import citation_spans
from score_lightning.rollout.engine import Generation, SamplingParams
from score_lightning.rollout.script_request import ScriptRequest, report_body  # noqa: F401  (re-exported)
from score_lightning.rollout.scripted_roles import SCRIPTED_ROLES, system_marker
from score_lightning.rollout.stops import first_stop

_QUESTION_RE = re.compile(r"Question: (.*?)\n\n", re.DOTALL)
_FIRST_QUERY_RE = re.compile(r"Queries:\n1\. (.*?)\n")


def prompt_role(prompt_text: str) -> str:
    """Which of the actor's prompts this is, from its system message: the core's three, else a method's registered
    role (:data:`~score_lightning.rollout.scripted_roles.SCRIPTED_ROLES`); ``"unknown"`` when none matches."""
    from score_lightning.roles.prompts import POINTWISE_SCORING_SYSTEM, RUBRIC_SYSTEM, SCORING_SYSTEM, SOLVER_SYSTEM

    core = (("rubric", RUBRIC_SYSTEM), ("scoring", SCORING_SYSTEM), ("scoring", POINTWISE_SCORING_SYSTEM),
            ("solver", SOLVER_SYSTEM))
    for role, system in (*core, *((name, r.system) for name, r in SCRIPTED_ROLES.items())):
        if system_marker(system) in prompt_text:
            return role
    return "unknown"


def prompt_query(prompt_text: str) -> str:
    m = _QUESTION_RE.search(prompt_text) or _FIRST_QUERY_RE.search(prompt_text)
    return m.group(1).strip() if m else ""


@dataclass
class _Thread:
    prompt: tuple[int, ...]
    context: list[int]
    role: str
    query: str
    index: int
    prompt_text: str
    turn: int = 0
    last_call: int = 0


class ScriptedEngine:
    """Replays ``respond(request)`` per generation; honours stop ids, stop strings, EOS and budgets."""

    def __init__(self, tokenizer, respond: Callable[[ScriptRequest], str | Sequence[int]], logprob: float = -1.0,
                 keep_calls: int = 8) -> None:
        self.tok = tokenizer
        self.respond = respond
        self.logprob = logprob
        self.keep_calls = keep_calls
        self.requests: list[ScriptRequest] = []  # every request seen, for tests
        self._threads: list[_Thread] = []
        self._calls = 0

    def sync_weights(self, named_tensors) -> None:
        return None

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        if params.value_readout:  # a script writes its values: there is no distribution to read them from
            raise ValueError("evaluator.score_readout=expected needs the HF engine, not rollout=scripted")
        self._calls += 1
        served: set[int] = set()
        fresh: dict[tuple[int, ...], int] = {}
        out = []
        for p in prompts:
            ids = [int(t) for t in p]
            thread = self._match(ids, served)
            if thread is None:
                key = tuple(ids)
                index = fresh.get(key, 0)
                fresh[key] = index + 1
                text = self.tok.decode(ids)
                thread = _Thread(key, list(ids), prompt_role(text), prompt_query(text), index, text)
                self._threads.append(thread)
            served.add(id(thread))
            request = ScriptRequest(thread.role, thread.query, thread.index, thread.turn, self.tok.decode(ids),
                                    thread.prompt_text)
            self.requests.append(request)
            reply = self.respond(request)
            new_ids = self.tok(reply, add_special_tokens=False)["input_ids"] if isinstance(reply, str) else list(reply)
            new_ids, finish = self._cut(list(new_ids), params)
            thread.context, thread.turn, thread.last_call = ids + new_ids, thread.turn + 1, self._calls
            out.append(Generation(new_ids, [self.logprob] * len(new_ids) if params.logprobs else None, finish))
        self._threads = [t for t in self._threads if self._calls - t.last_call < self.keep_calls]
        return out

    def _match(self, ids: list[int], served: set[int]) -> _Thread | None:
        """The live trajectory this context continues: the longest generated context that prefixes it."""
        best = None
        for t in self._threads:
            n = len(t.context)
            if id(t) in served or n == len(t.prompt) or n > len(ids) or ids[:n] != t.context:
                continue
            if best is None or n > len(best.context):
                best = t
        return best

    def _cut(self, ids: list[int], params: SamplingParams) -> tuple[list[int], str]:
        """Stop where a sampler would (:func:`~score_lightning.rollout.stops.first_stop`): after the first
        stop id / end-of-turn id, or at the token completing a stop string, keeping that whole token
        (``>\n`` when the reply goes on after the tag); then the budget."""
        from score_lightning.policy.models import end_of_turn_ids

        stops = (*params.stop_token_ids, *end_of_turn_ids(self.tok))
        n = first_stop(ids, self.tok.decode, stops, params.stop_strings)
        ids, finish = (ids, "length") if n is None else (ids[:n], "stop")
        if len(ids) > params.max_new_tokens:
            ids, finish = ids[: params.max_new_tokens], "length"
        return ids, finish


# ----------------------------------------------------------------------------- the default script
_POOL_LINE_RE = re.compile(r"^- ([a-z][a-z0-9_]*): ", re.MULTILINE)
_RUBRIC_LINE_RE = re.compile(r"^- ([a-z][a-z0-9_]*) \(weight ", re.MULTILINE)
_K_RE = re.compile(r"k = (\d+) dimensions; must include: (.*?); each weight between ([0-9.]+) and ([0-9.]+)")
_OBS_ID_RE = re.compile(r"(?:^|<observation>)\[([^\]\s]+)\] ", re.MULTILINE)
_REPORT_RE = re.compile(r"\[Report (\d+)\]\n(.*?)(?=\n\n\[Report \d+\]|\Z)", re.DOTALL)
_RETRIEVED_LINE_RE = re.compile(r"^Retrieved by its searches:.*\n", re.MULTILINE)


class ProtocolResponder:
    """A deterministic script that exercises every part of a SCORE step with non-zero rewards.

    * rubric: the must-include dimensions, then pool dimensions in order, equal weights (valid
      under the constraints stated in the prompt);
    * solver rollout k: one search on the query's words, then a report citing the first retrieved
      id; k % 3 == 0 writes a longer report, k % 3 == 1 a short one with a different conclusion,
      k % 3 == 2 forgets the citation (invalid when ``reward.require_citation``);
    * scoring: ``verify_searches`` searches, then every report scored by how many retrieved ids it
      cites and how long it is, with verification and gap-analysis sections.

    Everything depends only on the request, never on randomness, so every data-parallel rank and a
    single process produce the same tokens for the same query.
    """

    def __init__(self, verify_searches: int = 1) -> None:
        self.verify_searches = verify_searches

    def __call__(self, req: ScriptRequest) -> str:
        if req.role == "rubric":
            return self.rubric(req)
        if req.role == "solver":
            return self.solver(req)
        if req.role == "scoring":
            return self.scoring(req)
        if req.role in SCRIPTED_ROLES:  # a method's role: solver.agent=mams, reward.step=rubric, rubric=evolving ...
            return SCRIPTED_ROLES.get(req.role).respond(req)
        return P.IM_END

    @staticmethod
    def rubric(req: ScriptRequest) -> str:
        m = _K_RE.search(req.prompt)
        pool = _POOL_LINE_RE.findall(req.prompt.split("Dimension pool:", 1)[-1])
        k = int(m.group(1)) if m else 3
        must = [d.strip() for d in m.group(2).split(",")] if m and m.group(2) != "none" else []
        dims = list(dict.fromkeys(must + pool))[:k]
        weight = f"{1.0 / len(dims):.4f}" if dims else "1.0"
        body = "".join(f'<dim name="{d}" weight="{weight}"/>' for d in dims)
        return f"<think>dimensions that separate strong reports</think>{P.DIMENSIONS_OPEN}{body}{P.DIMENSIONS_CLOSE}"

    @staticmethod
    def solver(req: ScriptRequest) -> str:
        words = " ".join(re.findall(r"[A-Za-z_.]+", req.query)[:4]) or "python"
        if req.turn == 0:
            return f"<think>search the corpus</think>{P.SEARCH_OPEN}{words}{P.SEARCH_CLOSE}"
        ids = _OBS_ID_RE.findall(req.context)
        return f"{P.ANSWER_OPEN}{report_body(words, ids[0] if ids else None, req.index % 3)}{P.ANSWER_CLOSE}"

    def scoring(self, req: ScriptRequest) -> str:
        if req.turn < self.verify_searches:
            return f"{P.SEARCH_OPEN}verify {req.query[:40]}{P.SEARCH_CLOSE}"
        dims = _RUBRIC_LINE_RE.findall(req.prompt.split("Rubric:", 1)[-1].split("Process rules", 1)[0])
        reports = []
        for rid, text in _REPORT_RE.findall(req.prompt.split("Process rules", 1)[-1]):  # K reports, or one (pointwise)
            cites = len(citation_spans(_RETRIEVED_LINE_RE.sub("", text)))
            value = min(10, 2 + 3 * cites + len(text) // 120)
            scores = "".join(f'<score dim="{d}" value="{value}" reason="cites {cites}"/>' for d in dims)
            reports.append(f'<report id="{rid}">{P.VERIFICATION_OPEN}checked {cites} citations{P.VERIFICATION_CLOSE}'
                           f"{P.GAP_OPEN}depth of analysis{P.GAP_CLOSE}{P.SCORES_OPEN}{scores}{P.SCORES_CLOSE}"
                           f"{P.REPORT_CLOSE}")
        return f"{P.EVALS_OPEN}{''.join(reports)}{P.EVALS_CLOSE}"
