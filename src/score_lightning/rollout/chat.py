"""Prompt token ids from chat messages, built once with the tokenizer's own chat template.

The agent loop then only ever appends token ids (generated, or observation ids), so nothing is
re-tokenised after this point (token drift across turns: TRL #5224, verl #3960).
"""

from __future__ import annotations


def encode_chat(tokenizer, messages: list[dict], max_tokens: int | None = None,
                key: str = "solver.max_prompt_tokens") -> list[int]:
    """Ids of ``messages`` with the chat template and an open assistant turn.

    A prompt longer than ``max_tokens`` is refused rather than silently cut: a cut prompt loses the
    question or the reports, and the model would be trained on a prompt nobody wrote.
    """
    enc = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = list(enc["input_ids"] if isinstance(enc, dict) or hasattr(enc, "keys") else enc)
    if max_tokens is not None and len(ids) > max_tokens:
        raise ValueError(
            f"a prompt has {len(ids)} tokens > {key}={max_tokens}; raise it or shorten the query"
        )
    return ids


def truncate_text(tokenizer, text: str, max_tokens: int) -> str:
    """``text`` cut to its first ``max_tokens`` tokens (a report inside the scoring prompt)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return text if len(ids) <= max_tokens else tokenizer.decode(ids[:max_tokens])
