"""Text samples of a step (query, rubric, report, reward, evaluation) for loggers that take text."""

from __future__ import annotations

from score_lightning.harness.state import HarnessState
from score_lightning.step.reward_assembly import StepRewards
from score_lightning.step.types import StepRollouts


def step_samples(ro: StepRollouts, rw: StepRewards, state: HarnessState, tokenizer) -> dict[str, str]:
    """Markdown texts keyed by tag: ``samples/trajectory``, ``samples/rubric``, ``harness/state_snapshot``."""
    t = ro.solver[0]
    ev = ro.scoring[0].model_text(tokenizer) if ro.scoring else ""
    rubric = ro.rubrics.first
    shown = rubric.to_xml() if not rubric.texts else "; ".join(f"{w:+.2f} {x}" for w, x in zip(rubric.weights, rubric.texts))
    out = {
        "samples/trajectory": (
            f"**query**: {ro.queries[0]}\n\n**rubric** (valid={ro.rubrics.valid} {ro.rubrics.error}): "
            f"`{shown}`\n\n**report**:\n```\n{t.response_text(tokenizer)}\n```\n\n"
            f"**reward**: {float(rw.rewards[0]):.3f}\n\n**evaluation**:\n```\n{ev}\n```"
        ),
        "harness/state_snapshot": "```json\n" + state.to_json(include_pool=False) + "\n```",
    }
    if ro.rubrics.samples:
        out["samples/rubric"] = "```\n" + tokenizer.decode(ro.rubrics.samples[0][0].response_ids) + "\n```"
    return out
