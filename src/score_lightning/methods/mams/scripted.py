"""MaMs's roles for the scripted engine (``rollout=scripted``), so ``experiment=mams_tiny`` steps with non-zero rewards.

* search: one search on the question's words, then ``<finish/>``;
* state: the memory keeps its facts and adds one cited fact for the first ``[doc_id]`` of the chunk;
* report: the scripted solver's report of quality ``k % 3`` (``k``: the rollout, which is the position among
  identical prompts while the K rollouts' states agree), citing the memory's first id.
"""

from __future__ import annotations

import re

from score_lightning.methods.mams import prompts as M
from score_lightning.rewards.citations import cited_ids
from score_lightning.rollout.script_request import ScriptRequest, report_body
from score_lightning.rollout.scripted_roles import LINE_ID_RE, SCRIPTED_ROLES, ScriptedRole, script_words


def mams_search(req: ScriptRequest) -> str:
    m = re.search(r"Searches so far: (\d+) of", req.prompt)
    if m is not None and int(m.group(1)) == 0:
        return f"<think>search the corpus</think><search>{script_words(req.query)}</search>"
    return M.FINISH


def mams_state(req: ScriptRequest) -> str:
    memory = M.prompt_section(req.prompt, "Memory")
    chunk = req.prompt.split("Results (chunk", 1)[-1]
    ids = [i for i in LINE_ID_RE.findall(chunk) if i not in cited_ids(memory)]
    if ids:
        memory = f"{memory} {script_words(req.query)} is documented in [{ids[0]}].".strip()
    memory = memory or "Nothing relevant yet."
    return f"{M.MEMORY_OPEN}{memory}{M.MEMORY_CLOSE}{M.PLAN_OPEN}Write the report from memory.{M.PLAN_CLOSE}"


def mams_report(req: ScriptRequest) -> str:
    ids = cited_ids(M.prompt_section(req.prompt, "Memory"))
    body = report_body(script_words(req.query), ids[0] if ids else None, req.index % 3)
    return f"{M.REPORT_OPEN}{body}{M.REPORT_CLOSE}"


SCRIPTED_ROLES.register("mams_search", ScriptedRole(M.MAMS_SEARCH_SYSTEM, mams_search))
SCRIPTED_ROLES.register("mams_state", ScriptedRole(M.MAMS_STATE_SYSTEM, mams_state))
SCRIPTED_ROLES.register("mams_report", ScriptedRole(M.MAMS_REPORT_SYSTEM, mams_report))
