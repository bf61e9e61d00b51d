"""Weight-edited "bigram chain" models: a checkpoint that writes a chosen token sequence, on any engine.

Random weights never write a protocol tag, so the stop and action paths of an engine would go
untested. :func:`bigram_chain_model` turns a checkpoint into a bigram model that, after token
``chain[i]``, writes ``chain[i + 1]`` with probability ~1 (HF and vLLM then agree token for token).
:func:`distinct_pieces` spells a text with vocabulary tokens that are not yet in the chain (a
bigram model needs each token once), e.g. ``</search>\\n`` as ``</`` ``sea`` ``rch`` ``>\\n`` in a
byte-level BPE vocabulary, so the last piece of a tag can carry more text as a real model's would.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from score_lightning import protocol as P
from score_lightning.retrieval.base import SearchHit

#: what :func:`search_then_answer` models write, turn by turn: each turn ends inside a token
SEARCH_TURN = f"{P.SEARCH_OPEN}json{P.SEARCH_CLOSE}\n"
ANSWER_TURN = f"{P.ANSWER_OPEN}pickle is fine [json.dumps], see it{P.ANSWER_CLOSE}."


def _byte_level() -> dict[int, str]:
    """GPT-2's byte -> printable character map, in which byte-level BPE vocabularies are written."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


_BYTES = _byte_level()


def distinct_pieces(tokenizer, text: str, used: set[int], max_len: int = 12) -> list[int]:
    """Ids spelling ``text`` (byte-level BPE vocabulary), none in ``used`` and none twice; adds them to ``used``.

    Longest pieces first, with backtracking; raises when the vocabulary cannot spell it that way.
    """
    vocab = tokenizer.get_vocab()
    s = "".join(_BYTES[b] for b in text.encode("utf-8"))

    def solve(i: int, taken: set[int]) -> list[int] | None:
        if i == len(s):
            return []
        for j in range(min(len(s), i + max_len), i, -1):
            tid = vocab.get(s[i:j])
            if tid is None or tid in taken:
                continue
            rest = solve(j, taken | {tid})
            if rest is not None:
                return [tid, *rest]
        return None

    ids = solve(0, set(used))
    if ids is None:
        raise ValueError(f"cannot spell {text!r} with unused tokens")
    assert tokenizer.decode(ids) == text
    used.update(ids)
    return ids


def bigram_chain_model(model, chain: Sequence[int], aliases: Sequence[int] = ()) -> None:
    """Make ``model`` write ``chain`` token after token, in place; ``aliases`` act like ``chain[0]``.

    With every layer's output projections zeroed the residual stream is the token embedding, so the
    logits depend only on the last token: embedding i is the unit vector e_slot(i), and the lm_head
    row of each chain token points at its predecessor's slot (logit ~80 after the final norm, ~0
    for every other token of the vocabulary).
    """
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        hidden = model.config.hidden_size
        assert len(set(chain)) == len(chain) and len(chain) < hidden and not set(aliases) & set(chain)
        unit = lambda slot: torch.nn.functional.one_hot(torch.tensor(slot), hidden).float()  # noqa: E731
        for slot, tok in enumerate(chain):
            model.model.embed_tokens.weight[tok] = unit(slot)
        for tok in aliases:
            model.model.embed_tokens.weight[tok] = unit(0)
        for slot, tok in enumerate(chain[1:]):
            model.lm_head.weight[tok] = 10.0 * unit(slot)


def chat_prompt(tokenizer, text: str) -> list[int]:
    """Ids of a one-message chat with the checkpoint's template and an open assistant turn."""
    enc = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    return list(enc["input_ids"] if hasattr(enc, "keys") else enc)


def search_then_answer(model, tokenizer) -> list[int]:
    """Edit ``model`` to write :data:`SEARCH_TURN` after every "\\n", and :data:`ANSWER_TURN` after that;
    returns a chat prompt it continues from.

    Both turns end on a token that completes the tag and carries more text (``>\\n``, ``>.``). The
    prompt ends with "\\n" (Qwen) or "\\n\\n" (Llama-3's header, made an alias), as every
    observation does, so the model searches again after each observation.
    """
    prompt = chat_prompt(tokenizer, "What does the json module do?")
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"][0]
    used = {newline, prompt[-1]}
    search, answer = distinct_pieces(tokenizer, SEARCH_TURN, used), distinct_pieces(tokenizer, ANSWER_TURN, used)
    assert tokenizer.decode(search[-1:]) == ">\n" and tokenizer.decode(answer[-1:]) == ">."
    bigram_chain_model(model, [newline, *search, *answer], aliases=[prompt[-1]] if prompt[-1] != newline else [])
    return prompt


class OneDoc:
    """A retriever that always returns the same passage."""

    def search(self, queries, topk):
        return [[SearchHit("json.dumps", "json.dumps serialises obj. Done.", 1.0)] for _ in queries]
