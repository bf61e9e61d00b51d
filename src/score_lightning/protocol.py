"""The tag protocol shared by the solver, the evaluator, the tokenizer and the parsers.

Every tag below is a single token in the tiny tokenizer, so rollouts can stop on token ids and
never need to re-tokenise text to find a tag boundary. Real checkpoints (Qwen) split them into
several tokens; the engines then stop on the tag *strings* instead (see ``rollout/engine.py``).
"""

from __future__ import annotations

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
OBS_OPEN, OBS_CLOSE = "<observation>", "</observation>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"

DIMENSIONS_OPEN, DIMENSIONS_CLOSE = "<dimensions>", "</dimensions>"
EVALS_OPEN, EVALS_CLOSE = "<report_evaluations>", "</report_evaluations>"
REPORT_CLOSE = "</report>"
VERIFICATION_OPEN, VERIFICATION_CLOSE = "<verification>", "</verification>"
GAP_OPEN, GAP_CLOSE = "<gap_analysis>", "</gap_analysis>"
SCORES_OPEN, SCORES_CLOSE = "<scores>", "</scores>"

# Chat-format markers (Qwen2 style). ``IM_END`` ends an assistant turn and is the EOS token.
IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"

#: Tags that become single (non-special, so they survive ``decode``) tokens in the tiny tokenizer.
PROTOCOL_TOKENS: tuple[str, ...] = (
    THINK_OPEN, THINK_CLOSE, SEARCH_OPEN, SEARCH_CLOSE, OBS_OPEN, OBS_CLOSE,
    ANSWER_OPEN, ANSWER_CLOSE, DIMENSIONS_OPEN, DIMENSIONS_CLOSE, EVALS_OPEN, EVALS_CLOSE,
    REPORT_CLOSE, VERIFICATION_OPEN, VERIFICATION_CLOSE, GAP_OPEN, GAP_CLOSE, SCORES_OPEN, SCORES_CLOSE,
)
SPECIAL_TOKENS: tuple[str, ...] = (ENDOFTEXT, IM_START, IM_END)

#: Fixed observation returned for a malformed action (unclosed tag, empty query, two queries).
INVALID_ACTION_OBSERVATION = (
    "Invalid action: write exactly one non-empty query as <search>query</search>, "
    "or finish with <answer>report</answer>."
)
#: Observation returned when the retriever failed after its retries.
RETRIEVAL_FAILED_OBSERVATION = "Retrieval failed: the search backend is unavailable. Continue with what you know."
#: Observation appended when the tool budget is spent; the next turn may only answer.
TOOL_BUDGET_OBSERVATION = "Search budget exhausted. Write the final report now inside <answer></answer>."


def _finish_block(finish_tag: str) -> str:
    """``<x></x>`` for a closing tag ``</x>``."""
    return finish_tag.replace("</", "<", 1) + finish_tag


def tool_budget_observation(finish_tag: str = ANSWER_CLOSE) -> str:
    """The budget notice for a role that finishes with ``finish_tag``: the solver is told to write its
    ``<answer>``, the evaluator its ``<report_evaluations>`` (an evaluator told to write an ``<answer>``
    writes one, and its scores no longer parse)."""
    if finish_tag == ANSWER_CLOSE:
        return TOOL_BUDGET_OBSERVATION
    return f"Search budget exhausted. Write the final output now inside {_finish_block(finish_tag)}."


def invalid_action_observation(finish_tag: str = ANSWER_CLOSE) -> str:
    """The invalid-action notice for a role that finishes with ``finish_tag`` (see above)."""
    if finish_tag == ANSWER_CLOSE:
        return INVALID_ACTION_OBSERVATION
    return ("Invalid action: write exactly one non-empty query as <search>query</search>, "
            f"or finish with {_finish_block(finish_tag)}.")
