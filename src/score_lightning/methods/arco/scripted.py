"""The step judge's role for the scripted engine (``rollout=scripted``), so ``experiment=arco_tiny`` steps with
non-zero step rewards: relevance grows with the words the search shares with the question, novelty is low for a
repeated query.
"""

from __future__ import annotations

import re

from score_lightning.methods.arco.judge import (
    STEP_EVAL_CLOSE, STEP_EVAL_OPEN, STEP_RUBRIC_CLOSE, STEP_RUBRIC_OPEN, STEP_SYSTEM,
)
from score_lightning.methods.mams.prompts import prompt_section
from score_lightning.rollout.script_request import ScriptRequest
from score_lightning.rollout.scripted_roles import SCRIPTED_ROLES, ScriptedRole, script_words, word_set


def step_judgement(req: ScriptRequest) -> str:
    m = re.search(r"This search: (.*)", req.prompt)
    search = m.group(1).strip() if m else ""
    earlier = [x.split(". ", 1)[-1].strip() for x in prompt_section(req.prompt, "Earlier searches").splitlines()]
    shared = word_set(search) & word_set(req.query)
    relevance, novelty = min(10, 2 + 2 * len(shared)), (2 if search in earlier else 8)
    return (f"{STEP_EVAL_OPEN}{STEP_RUBRIC_OPEN}A useful query names {script_words(req.query)} precisely."
            f'{STEP_RUBRIC_CLOSE}<step_score relevance="{relevance}" novelty="{novelty}"/>{STEP_EVAL_CLOSE}')


SCRIPTED_ROLES.register("step", ScriptedRole(STEP_SYSTEM, step_judgement))
