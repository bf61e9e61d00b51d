"""RLER's and DR-rubric's item writers for the scripted engine (``rollout=scripted``), so ``rler_tiny`` and
``drrubric_tiny`` step with written items:

* items: a first set from the search results, new ones when contrasting two reports;
* research (DR-rubric's Stage I): one search on the question's words, then notes citing the first passage;
* distil (Stage II): four items, one joining two checks with ";" and one repeating another (the atomic split and
  merge).
"""

from __future__ import annotations

import re

from score_lightning.methods.rler.items import ITEMS_SYSTEM
from score_lightning.methods.rler.research_prompts import DISTIL_SYSTEM, RESEARCH_SYSTEM
from score_lightning.rollout.script_request import ScriptRequest
from score_lightning.rollout.scripted_roles import OBS_ID_RE, SCRIPTED_ROLES, ScriptedRole, script_words


def item_writing(req: ScriptRequest) -> str:
    words = " ".join(re.findall(r"[A-Za-z_.]+", req.query)[:3]) or "the question"
    if "[Best report]" in req.prompt:
        body = (f'<item weight="0.5">Gives a concrete example of {words}</item>'
                '<item weight="0.3" sign="-">States a conclusion without any citation</item>')
    else:
        body = (f'<item weight="0.4">Explains {words} with a cited document</item>'
                '<item weight="0.3">Cites at least two retrieved documents</item>'
                '<item weight="0.3">Ends with a one-sentence conclusion</item>')
    return f"<rubric_items>{body}</rubric_items>"


def rubric_research(req: ScriptRequest) -> str:
    if req.turn == 0:
        return f"<search>{script_words(req.query)}</search>"
    ids = OBS_ID_RE.findall(req.context[len(req.prompt):])  # what its own searches returned
    cite = f" [{ids[0]}]" if ids else ""
    return (f"<findings>{script_words(req.query)} is documented{cite}; a report needs an example and a conclusion; "
            "a common mistake is an uncited claim.</findings>")


def rubric_distil(req: ScriptRequest) -> str:
    words = script_words(req.query)
    return ("<rubric_items>"
            f'<item weight="0.4">Explains {words} with a cited document; Gives a concrete example</item>'
            '<item weight="0.3">Cites at least two retrieved documents</item>'
            '<item weight="0.2" sign="-">States a conclusion without any citation</item>'
            '<item weight="0.1">cites at least two retrieved documents.</item></rubric_items>')


SCRIPTED_ROLES.register("items", ScriptedRole(ITEMS_SYSTEM, item_writing))
SCRIPTED_ROLES.register("research", ScriptedRole(RESEARCH_SYSTEM, rubric_research))
SCRIPTED_ROLES.register("distil", ScriptedRole(DISTIL_SYSTEM, rubric_distil))
