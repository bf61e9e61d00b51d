"""RubricEM's solver and stage judge for the scripted engine (``rollout=scripted``), so ``experiment=rubricem_tiny``
steps with non-zero rewards and stage credit.
"""

from __future__ import annotations

from score_lightning.methods.rubricem.prompts import RUBRICEM_SYSTEM, STAGE_JUDGE_SYSTEM
from score_lightning.rewards.citations import citation_spans, cited_ids
from score_lightning.rollout.script_request import ScriptRequest, report_body
from score_lightning.rollout.scripted_roles import OBS_ID_RE, SCRIPTED_ROLES, ScriptedRole, script_words


def rubricem_solver(req: ScriptRequest) -> str:
    """Plan and search, then review and answer (report quality k % 3, as the ReAct script's)."""
    words = script_words(req.query)
    if req.turn == 0:
        return (f'<plan><rubric_items><item weight="0.6">Explains {words} with a cited document</item>'
                f'<item weight="0.4">Ends with a conclusion</item></rubric_items></plan><search>{words}</search>')
    ids = OBS_ID_RE.findall(req.context[len(req.prompt):])
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


SCRIPTED_ROLES.register("rubricem", ScriptedRole(RUBRICEM_SYSTEM, rubricem_solver))
SCRIPTED_ROLES.register("stage_judge", ScriptedRole(STAGE_JUDGE_SYSTEM, stage_judgement))
