"""Where a generated turn stops, found the same way for every engine and every tokenizer.

A protocol tag is one token in the tiny tokenizer but several BPE pieces in real ones
(``</search>`` is ``</`` ``search`` ``>`` in Qwen2.5 and Llama-3), and the last piece may carry
characters beyond the tag (``>\\n`` is one token, so ``</search>\\n`` ends on it). Engines therefore
stop on the tag *string* and keep that whole last token: HF's ``StopStringCriteria`` fires on the
first token whose text completes the string ("overhang" allowed), vLLM checks the detokenised text
after each token and, with ``include_stop_str_in_output``, returns every token id up to and
including that one. The helpers below reproduce that rule on token ids, so the HF engine, the
scripted engine and the agent loop agree on where a turn ended, and never re-tokenise anything.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Decode = Callable[[list[int]], str]


class TagStops:
    """Stop criteria for a set of tags: token ids when a tag is one token, else stop strings.

    ``token_ids`` also holds every end-of-turn id of the tokenizer (``models.end_of_turn_ids``:
    the chat template's turn end, the configured EOS and ``generation_config.json``'s EOS list),
    so an engine stops on each of them even where its own default EOS is another one.
    """

    def __init__(self, tokenizer, tags: Sequence[str]):
        from score_lightning.policy.models import end_of_turn_ids

        ids, strings = [], []
        for tag in tags:
            enc = tokenizer(tag, add_special_tokens=False)["input_ids"]
            (ids.append(enc[0]) if len(enc) == 1 else strings.append(tag))
        self.tags = tuple(tags)
        self.end_ids = end_of_turn_ids(tokenizer)
        self.token_ids = tuple(dict.fromkeys([*ids, *self.end_ids]))
        self.strings = tuple(strings)


def first_stop(ids: Sequence[int], decode: Decode, stop_ids: Sequence[int] = (),
               stop_strings: Sequence[str] = ()) -> int | None:
    """Length of the shortest prefix of ``ids`` that ends on a stop id or whose text contains a stop string.

    ``None`` when nothing stops it. The prefix ends with the token that completed the string, all
    of it: the characters after the string in that token stay part of the turn (as both engines
    return them). "Contains" only grows with the prefix, so the string search is a binary search.
    """
    ids = [int(t) for t in ids]
    stops = set(stop_ids)
    n = next((j + 1 for j, t in enumerate(ids) if t in stops), None)
    head = ids if n is None else ids[:n]
    if not stop_strings or not head:
        return n

    def hit(k: int) -> bool:
        text = decode(head[:k])
        return any(s in text for s in stop_strings)

    if not hit(len(head)):
        return n
    lo, hi = 1, len(head)
    while lo < hi:
        mid = (lo + hi) // 2
        if hit(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def completed_tag(ids: Sequence[int], decode: Decode, tags: Sequence[str]) -> tuple[str, int] | None:
    """The tag the turn's *last token* completed, and where it ends in ``decode(ids)``; else ``None``.

    A tag counts only when the last token finishes a new occurrence of it: that is the one an
    engine stopped on. An earlier occurrence assembled from pieces (possible with the tiny
    tokenizer, where the stop is the single-token tag) or a tag the engine was not stopping on
    in this turn is not an action. Characters after the tag (``\\n`` in ``>\\n``) are the same
    token's overhang and belong to the turn.
    """
    ids = [int(t) for t in ids]
    if not ids:
        return None
    text, before = decode(ids), decode(ids[:-1])
    done = [(text.rfind(t), t) for t in tags if t and text.count(t) > before.count(t)]
    if not done:
        return None
    start, tag = min(done)
    return tag, start + len(tag)


def stop_window(strings: Sequence[str]) -> int:
    """Tokens to decode to see a stop string complete: a string of m UTF-8 bytes spans at most m tokens plus one
    partial."""
    return max((len(s.encode("utf-8")) for s in strings), default=0) + 2


def completes_stop(decode: Decode, ids: Sequence[int], strings: Sequence[str], window: int) -> bool:
    """Whether the newest of ``ids`` completed one of ``strings``: decoding the last ``window`` ids finds more
    occurrences than decoding them without the newest (only that window is decoded, once per new token)."""
    if not strings or not ids:
        return False
    tail = list(ids[-window:])
    text, before = decode(tail), decode(tail[:-1])
    return any(text.count(s) > before.count(s) for s in strings)
