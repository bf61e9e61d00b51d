"""What a scripted engine's responder is asked (:class:`ScriptRequest`), and the scripted solver's report.

Kept apart from :mod:`~score_lightning.rollout.scripted` (the engine and the default script) so that
the workflow roles' script (:mod:`~score_lightning.rollout.scripted_roles`) can use both without
importing the engine that dispatches to it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScriptRequest:
    role: str  # "rubric" | "items" (RLER) | "solver" | "scoring" | "mams_search" | "mams_state" | "mams_report"
    #            | "step" (a step judgement) | "research" / "distil" (DR-rubric) | "unknown"
    query: str  # the question (for a rubric prompt: the first listed query)
    index: int  # position among identical prompts of the same batch: the rollout k for the solver
    turn: int  # 0 for the first generation of this trajectory
    context: str  # decoded prompt + every generated and observed token so far
    prompt: str  # decoded initial prompt


def report_body(words: str, doc_id: str | None, variant: int) -> str:
    """The scripted report of quality ``variant``: 0 long and cited twice, 1 short and cited, 2 uncited."""
    cite = f" [{doc_id}]" if doc_id else ""
    if variant == 0:
        return (f"The documentation describes {words}{cite}. It explains the behaviour in detail and "
                f"gives the main caveats{cite}.\n\nConclusion: {words} is documented in the standard library.")
    if variant == 1:
        return f"{words} is covered by the corpus{cite}.\n\nConclusion: see the module documentation first."
    return f"{words} is probably relevant here, but I did not check it.\n\nConclusion: unclear."
