"""MaMs demonstrations (``solver.agent=mams``): whole search / state / report runs, one demo per role call.

A run is replayed through the real MaMs loop (:func:`~score_lightning.methods.mams.agent.run_mams`) with a
scripted engine whose answers are written from what each role's prompt shows, so prompts, chunking,
budgets and token ids are exactly those of an RL rollout:

* search: ``<think>`` (sometimes), then the planned queries one by one, then ``<finish/>``;
* state: the memory keeps up to three facts, each a sentence of a passage whose ``[doc_id]`` line
  starts in the chunk being read; the plan names the next query or says to write the report;
* report: a cited answer built from the memory's facts only (the solver demos' answer builder),
  ending with ``Conclusion: ...``.

A run whose report is not a valid cited answer, or whose any role output failed to parse or was cut
by its budget, is retried with fewer searches and then dropped. Every segment becomes a :class:`Demo`
(kind ``mams_<role>``) with EOS appended, like the solver demos.
"""

from __future__ import annotations

import random
import re

from score_lightning.rewards.citations import citation_spans
from score_lightning.methods.mams import prompts as M
from score_lightning.roles.answer import parse_answer
from score_lightning.roles.prompts import format_rubric
from score_lightning.roles.rubric import Rubric, fallback_rubric
from score_lightning.methods.mams.agent import MamsConfig, mams_settings, run_mams
from score_lightning.rollout.scripted import ScriptedEngine, ScriptRequest
from score_lightning.rollout.trajectory import Trajectory
from score_lightning.sft.context import DemoContext
from score_lightning.sft.demo_registry import DEMO_SOURCES, DemoSource, ExtraKind
from score_lightning.sft.demo_types import Demo
from score_lightning.sft.rubric_demos import random_rubric, random_state
from score_lightning.sft.solver_demos import Evidence, build_answer, solver_plan
from score_lightning.roles.text import first_sentence

_LINE_RE = re.compile(r"(?:^|\n)\[([^\]\s]+)\] ([^\n]*)")
_MAX_FACTS = 3


def memory_facts(memory: str) -> list[Evidence]:
    """The ``sentence [doc_id].`` facts of a memory, in order (a fact ends at a citation followed by a full stop)."""
    facts, last = [], 0
    for start, end, doc_id in citation_spans(memory):
        if memory.startswith(".", end):
            if memory[last:start].strip():
                facts.append(Evidence(doc_id, memory[last:start].strip() + "."))
            last = end + 1
    return facts


class MamsDemoScript:
    """Answers each MaMs role prompt of one planned run (the queries ``qs``) from what the prompt shows."""

    def __init__(self, ctx: DemoContext, rng: random.Random, query: str, qs: list[str], rubric: Rubric):
        self.ctx, self.rng, self.query, self.qs, self.rubric = ctx, rng, query, qs, rubric

    def __call__(self, req: ScriptRequest) -> str:
        if req.role == "mams_search":
            done = int(re.search(r"Searches so far: (\d+) of", req.prompt).group(1))
            if done >= len(self.qs):
                return M.FINISH
            think = f"<think>Next I need {self.qs[done]}.</think>" if self.rng.random() < 0.5 else ""
            return f"{think}<search>{self.qs[done]}</search>"
        if req.role == "mams_state":
            return self._state(req.prompt)
        if req.role == "mams_report":
            facts = memory_facts(M.prompt_section(req.prompt, "Memory"))
            body = build_answer(self.rng, self.query, facts, self.rubric, self.ctx.known_ids, max_claims=2) if facts else ""
            return f"{M.REPORT_OPEN}{body}{M.REPORT_CLOSE}"
        return ""

    def _state(self, prompt: str) -> str:
        facts = memory_facts(M.prompt_section(prompt, "Memory"))
        chunk = prompt.split("Results (chunk", 1)[-1].split("\n", 1)[-1].split("<|", 1)[0]  # no template tail
        for doc_id, text in _LINE_RE.findall(chunk):
            sentence = first_sentence(text)
            if sentence and all(f.doc_id != doc_id for f in facts):
                facts.append(Evidence(doc_id, sentence))
        facts = facts[-_MAX_FACTS:]
        memory = " ".join(f"{f.sentence.rstrip('.')} [{f.doc_id}]." for f in facts) or "Nothing relevant yet."
        done = self._searched(prompt)
        plan = f"Search {self.qs[done]}." if done < len(self.qs) else "Write the report from memory."
        return f"{M.MEMORY_OPEN}{memory}{M.MEMORY_CLOSE}{M.PLAN_OPEN}{plan}{M.PLAN_CLOSE}"

    def _searched(self, prompt: str) -> int:
        """How many planned queries are done, from the prompt's current search."""
        m = re.search(r"\nSearch: (.*)", prompt)
        current = m.group(1).strip() if m else ""
        return self.qs.index(current) + 1 if current in self.qs else len(self.qs)


def mams_group(ctx: DemoContext, rng: random.Random, query: str, n: int, mams: MamsConfig) -> list[Demo]:
    """``n`` MaMs runs for one query (one rubric): their role calls as demos; the first search prompt is shared."""
    state = random_state(rng, ctx.base, ctx.b.evaluator_max_tool_calls)
    rubric = fallback_rubric(state) if rng.random() < 0.4 else random_rubric(rng, state)
    out: list[Demo] = []
    for _ in range(n):
        traj = _run(ctx, random.Random(rng.random()), query, rubric, format_rubric(rubric, state), mams)
        if traj is None:
            continue
        for seg in traj.segments:
            out.append(Demo(f"mams_{seg.role}", seg.prompt_ids, seg.response_ids + [ctx.eos], seg.response_mask + [1],
                            meta={"query": query, "turn": seg.turn, "search_queries": list(traj.search_queries)}))
    return out


def _run(ctx: DemoContext, rng: random.Random, query: str, rubric: Rubric, rubric_text: str,
         mams: MamsConfig) -> Trajectory | None:
    """One valid scripted run, with fewer searches on each retry; ``None`` when none is valid."""
    n_search = min(rng.choices([1, 2, 3], weights=[0.5, 0.4, 0.1])[0], mams.max_searches)
    for attempt in range(4):
        sub = random.Random(rng.random())
        qs, _ = solver_plan(ctx, sub, query, max(1, n_search - attempt // 2))
        engine = ScriptedEngine(ctx.tok, MamsDemoScript(ctx, sub, query, qs, rubric), keep_calls=2)
        traj = run_mams(engine, ctx.tok, [query], [rubric_text], ctx.retriever, mams)[0]
        answer = parse_answer(traj.model_text(ctx.tok), traj.truncated, require_citation=True)
        if answer.valid and not traj.invalid_actions and traj.search_queries == qs and _complete(traj, ctx, mams):
            return traj
    return None


def _complete(traj: Trajectory, ctx: DemoContext, mams: MamsConfig) -> bool:
    """No role output was cut by its budget (each must end on its closing tag)."""
    budgets = {"search": mams.search_tokens, "state": mams.state_tokens, "report": mams.report_tokens}
    return all(len(s.response_ids) < budgets[s.role] for s in traj.segments)


def _key_fields(cfg, counts, on: bool) -> dict:
    """MaMs's budgets and counts in the SFT cache key (present, zeroed, while off: the packaged keys hold them)."""
    return {"mams": mams_settings(cfg.solver) if on else None, "num_mams": int(counts["mams"]) if on else 0,
            "mams_per_prompt": int(counts["mams_per_prompt"])}


def _kinds(fields) -> list[ExtraKind]:
    mams = fields["mams"]
    if fields["num_mams"] <= 0 or mams is None:
        return []
    return [ExtraKind("mams", fields["num_mams"], fields["mams_per_prompt"],
                      lambda ctx, rng, query, n: mams_group(ctx, rng, query, n, mams))]


#: ``solver.agent=mams``: whole MaMs runs (one demo per role call); first among the sources
DEMO_SOURCES["solver.agent"].register("mams", DemoSource(0, {"mams": 240, "mams_per_prompt": 2}, _key_fields, _kinds))
