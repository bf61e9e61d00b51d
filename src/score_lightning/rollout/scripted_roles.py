"""Scripted answers for the solver workflows' roles: MaMs search / state / report, and step judgements.

Used by :class:`~score_lightning.rollout.scripted.ProtocolResponder` (``rollout=scripted``) so that
``experiment=mams_tiny`` and ``experiment=arco_tiny`` run their steps with non-zero rewards. Like the
rest of the script, every answer depends only on the request:

* MaMs search: one search on the question's words, then ``<finish/>``;
* MaMs state: the memory keeps its facts and adds one cited fact for the first ``[doc_id]`` of the chunk;
* MaMs report: the scripted solver's report of quality ``k % 3`` (``k``: the rollout, which is the
  position among identical prompts while the K rollouts' states agree), citing the memory's first id;
* step judgement: relevance grows with the words the search shares with the question, novelty is
  low for a repeated query;
* DR-rubric research: one search on the question's words, then notes citing the first passage;
  distillation: four items, one joining two checks with ";" and one repeating another (the atomic split and merge).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from score_lightning.rewards.citations import citation_spans, cited_ids
from score_lightning.methods.mams import prompts as M
from score_lightning.methods.arco.judge import STEP_EVAL_CLOSE, STEP_EVAL_OPEN, STEP_RUBRIC_CLOSE, STEP_RUBRIC_OPEN
from score_lightning.rollout.script_request import ScriptRequest, report_body

_WORD_RE = re.compile(r"[A-Za-z_.]+")
#: ``[id] `` heading a passage of an observation (what a search returned, not a citation)
_OBS_ID_RE = re.compile(r"(?:^|<observation>)\[([^\]\s]+)\] ", re.MULTILINE)
_LINE_ID_RE = re.compile(r"(?:^|\n)\[([^\]\s]+)\] ")


def _words(query: str) -> str:
    return " ".join(_WORD_RE.findall(query)[:4]) or "python"


def mams_search(req: ScriptRequest) -> str:
    m = re.search(r"Searches so far: (\d+) of", req.prompt)
    if m is not None and int(m.group(1)) == 0:
        return f"<think>search the corpus</think><search>{_words(req.query)}</search>"
    return M.FINISH


def mams_state(req: ScriptRequest) -> str:
    memory = M.prompt_section(req.prompt, "Memory")
    chunk = req.prompt.split("Results (chunk", 1)[-1]
    ids = [i for i in _LINE_ID_RE.findall(chunk) if i not in cited_ids(memory)]
    if ids:
        memory = f"{memory} {_words(req.query)} is documented in [{ids[0]}].".strip()
    memory = memory or "Nothing relevant yet."
    return f"{M.MEMORY_OPEN}{memory}{M.MEMORY_CLOSE}{M.PLAN_OPEN}Write the report from memory.{M.PLAN_CLOSE}"


def mams_report(req: ScriptRequest) -> str:
    ids = cited_ids(M.prompt_section(req.prompt, "Memory"))
    return f"{M.REPORT_OPEN}{report_body(_words(req.query), ids[0] if ids else None, req.index % 3)}{M.REPORT_CLOSE}"


def step_judgement(req: ScriptRequest) -> str:
    m = re.search(r"This search: (.*)", req.prompt)
    search = m.group(1).strip() if m else ""
    earlier = [x.split(". ", 1)[-1].strip() for x in M.prompt_section(req.prompt, "Earlier searches").splitlines()]
    shared = {w.lower() for w in _WORD_RE.findall(search)} & {w.lower() for w in _WORD_RE.findall(req.query)}
    relevance, novelty = min(10, 2 + 2 * len(shared)), (2 if search in earlier else 8)
    return (f"{STEP_EVAL_OPEN}{STEP_RUBRIC_OPEN}A useful query names {_words(req.query)} precisely."
            f'{STEP_RUBRIC_CLOSE}<step_score relevance="{relevance}" novelty="{novelty}"/>{STEP_EVAL_CLOSE}')


def rubric_research(req: ScriptRequest) -> str:
    if req.turn == 0:
        return f"<search>{_words(req.query)}</search>"
    ids = _OBS_ID_RE.findall(req.context[len(req.prompt):])  # what its own searches returned
    cite = f" [{ids[0]}]" if ids else ""
    return (f"<findings>{_words(req.query)} is documented{cite}; a report needs an example and a conclusion; "
            "a common mistake is an uncited claim.</findings>")


def rubric_distil(req: ScriptRequest) -> str:
    words = _words(req.query)
    return ("<rubric_items>"
            f'<item weight="0.4">Explains {words} with a cited document; Gives a concrete example</item>'
            '<item weight="0.3">Cites at least two retrieved documents</item>'
            '<item weight="0.2" sign="-">States a conclusion without any citation</item>'
            '<item weight="0.1">cites at least two retrieved documents.</item></rubric_items>')


def rubricem_solver(req: ScriptRequest) -> str:
    """Plan and search, then review and answer (report quality k % 3, as the ReAct script's)."""
    words = _words(req.query)
    if req.turn == 0:
        return (f'<plan><rubric_items><item weight="0.6">Explains {words} with a cited document</item>'
                f'<item weight="0.4">Ends with a conclusion</item></rubric_items></plan><search>{words}</search>')
    ids = _OBS_ID_RE.findall(req.context[len(req.prompt):])
    review = f"<review>found [{ids[0]}] for the first item</review>" if ids and req.index % 3 != 2 else \
        "<review>nothing checked</review>"
    return f"{review}<answer>{report_body(words, ids[0] if ids else None, req.index % 3)}</answer>"


def stage_judgement(req: ScriptRequest) -> str:
    """Stage scores that follow what each stage shows: a plan, searches, a review citing an id, a cited answer."""
    answer = req.prompt.split("[Answer]", 1)[-1]
    review = req.prompt.split("[Review]", 1)[-1].split("[Answer]", 1)[0]
    plan = req.prompt.split("[Plan]", 1)[-1].split("[Research", 1)[0]
    cited = len(citation_spans(answer))
    return (f'<stage_scores plan="{7 if "<item" in plan else 2}" '
            f'research="{6 if "(no search)" not in req.prompt else 1}" review="{8 if cited_ids(review) else 3}" '
            f'answer="{min(10, 3 + 3 * cited)}"/>')


WORKFLOW_ROLES: dict[str, Callable[[ScriptRequest], str]] = {
    "mams_search": mams_search, "mams_state": mams_state, "mams_report": mams_report, "step": step_judgement,
    "research": rubric_research, "distil": rubric_distil, "rubricem": rubricem_solver, "stage_judge": stage_judgement,
}
