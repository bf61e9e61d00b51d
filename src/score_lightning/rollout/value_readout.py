"""``evaluator.score_readout=expected``: a score read as the model's expected value, not one sampled number.

Why: a sampled value is one draw from the evaluator's distribution over 0..10; two reports the model
rates alike can get 3 and 8 by chance, and a 2-layer judge's distribution is wide. G-Eval reads the
score as sum_v p(v) * v over the value tokens at the score position instead. Teacher-forced, the tiny
cold start's expected values separated report kinds far more than its sampled ones (NOTES.md).

**Where the distribution comes from.** The constrained scoring grammar writes ``value="`` and then a
value matching ``(10|[0-9])`` (:mod:`~score_lightning.rollout.constrained`). The position of the
value's first token is the one where every token the grammar allows starts with a digit
(:meth:`ValueReadout.is_value_position`); nowhere else in that grammar is that so (free text allows
letters; after ``1`` the closing quote is allowed too). The fast-forward decoder
(:mod:`~score_lightning.rollout.fast_forward`) reads the model's logits there, whether the text before
it was sampled or forced; the token that then fills the position is irrelevant to the readout.

**The exact rule.** With p the model's distribution at that position at temperature 1 (the model's
own, whatever ``evaluator.scoring_temperature`` and top-p the sampler uses), renormalised over the
allowed tokens A, each allowed token t contributes p(t) times its value:

* t's text is its leading digits followed by more text (``7"``): the value is those digits;
* t's digits cannot be extended to another value 0..10 (``0``, ``2``..``9``, ``10``; and ``1"``): their value;
* t is ``1`` alone, a prefix of both 1 and 10 (tokenizers that split digits, as Qwen2.5's and the tiny
  one's, write 10 as ``1`` ``0``; Llama-3's has a ``10`` token but may also spell it ``1`` ``0``): the
  decoder feeds t in one extra forward and reads the next distribution p'(. | t), renormalised over what
  the grammar allows after t; t's share goes to 10 with p'(tokens starting with ``0``) and to 1 with the
  rest (``"``, ``"/>``, ...). That forward's column is masked out afterwards, so nothing later sees it.

So E = sum_{t in A, not ambiguous} p(t) v(t) + sum_{t ambiguous} p(t) (p'(0.. | t) * 10 + (1 - p'(0.. | t)) * 1),
in 0..10; the parse stores E / 10 as the score, as it stores a written value.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from score_lightning.rollout.constrained import allowed_tokens

#: the values the scoring grammar allows, as text
VALUES = tuple(str(v) for v in range(11))
DIGITS = "0123456789"


def _split(text: str) -> tuple[str, str]:
    """Leading ASCII digits of ``text`` and the rest."""
    n = 0
    while n < len(text) and text[n] in DIGITS:
        n += 1
    return text[:n], text[n:]


def is_ambiguous(text: str) -> bool:
    """A token that is only digits, a proper prefix of another allowed value (``1``: 1 or 10)."""
    digits, rest = _split(text)
    return bool(digits) and not rest and any(v != digits and v.startswith(digits) for v in VALUES)


def token_value(text: str, after: str = "") -> int:
    """The value a first token (and, for an ambiguous one, the token after it) spells: its leading digits."""
    digits, _ = _split(text + after)
    if digits not in VALUES:
        raise ValueError(f"{text + after!r} does not start with a score value 0..10")
    return int(digits)


#: one allowed first token: its text, its probability, and for an ambiguous one the allowed next tokens'
#: ``(text, probability)`` (``None`` otherwise)
FirstToken = tuple[str, float, "Sequence[tuple[str, float]] | None"]


def expected_value(first: Sequence[FirstToken]) -> float:
    """E[v] over the allowed first tokens (probabilities renormalised here, and each ambiguous token's next
    distribution renormalised too): the rule of the module docstring."""
    total = sum(p for _, p, _ in first)
    if total <= 0:
        raise ValueError("no probability on any allowed value token")
    out = 0.0
    for text, p, nxt in first:
        if not is_ambiguous(text):
            out += p * token_value(text)
            continue
        if not nxt:
            raise ValueError(f"value token {text!r} is a prefix of two values: its next distribution is needed")
        z = sum(q for _, q in nxt)
        out += p * sum(q * token_value(text, u) for u, q in nxt) / z
    return out / total


class ValueReadout:
    """One tokenizer's view of the value tokens: which ids start with a digit, their texts, which are ambiguous."""

    def __init__(self, tokenizer, vocab: int):
        n = min(int(vocab), len(tokenizer))
        self.vocab = int(vocab)
        self.texts: dict[int, str] = {}
        self.digit_led = torch.zeros(self.vocab, dtype=torch.bool)
        for i, text in enumerate(tokenizer.batch_decode([[i] for i in range(n)])):  # one pass: ~1 s for 152k ids
            if text[:1] and text[:1] in DIGITS:
                self.texts[i] = text
                self.digit_led[i] = True
        self._decode = tokenizer.decode

    def is_value_position(self, allowed: torch.Tensor) -> bool:
        """``allowed [V]`` (the grammar's mask here) is non-empty and holds only digit-led tokens."""
        allowed = allowed.cpu()
        return bool(allowed.any()) and not bool((allowed & ~self.digit_led[:allowed.shape[0]]).any())

    def first(self, logits: torch.Tensor, allowed: torch.Tensor) -> list[tuple[int, str, float]]:
        """The allowed first tokens' ``(id, text, p)`` under ``softmax(logits)`` (T = 1, before renormalising)."""
        ids = torch.nonzero(allowed.cpu()).view(-1).tolist()
        probs = torch.softmax(logits.float(), dim=-1).cpu()
        return [(i, self.texts[i], float(probs[i])) for i in ids]

    def after(self, logits: torch.Tensor, allowed: torch.Tensor) -> list[tuple[str, float]]:
        """The allowed next tokens' ``(text, p)`` under ``softmax(logits)`` (after an ambiguous first token)."""
        ids = torch.nonzero(allowed.cpu()).view(-1).tolist()
        probs = torch.softmax(logits.float(), dim=-1).cpu()
        return [(self._decode([i]), float(probs[i])) for i in ids]


_READOUTS: dict[tuple[int, int], ValueReadout] = {}


def value_readout(tokenizer, vocab: int) -> ValueReadout:
    """The :class:`ValueReadout` of ``tokenizer`` at the model's vocabulary width (built once per pair)."""
    key = (id(tokenizer), int(vocab))
    if key not in _READOUTS:
        _READOUTS[key] = ValueReadout(tokenizer, vocab)
    return _READOUTS[key]


def branch_matcher(matcher: Any, token: int) -> Any:
    """A copy of ``matcher`` that has consumed ``token`` (the ambiguous first token), for the mask after it."""
    copy = matcher.deep_copy()
    copy.consume_token(int(token))
    return copy


def read_values(readout: ValueReadout, at: Sequence[tuple[int, Any, torch.Tensor, torch.Tensor]],
                branch: Callable[[dict[int, int]], dict[int, torch.Tensor]]) -> dict[int, float]:
    """E[v] of each row at a value position. ``at``: ``(row, its matcher before the value, the model's raw logits
    [V] there, the grammar's mask [V] there)``. ``branch({row: token})`` feeds each row one ambiguous first token
    in a column nothing later attends to and returns the raw logits after it (one call per ambiguous token)."""
    firsts = {row: readout.first(logits, allowed) for row, _, logits, allowed in at}
    matchers = {row: m for row, m, _, _ in at}
    pending = {row: [i for i, text, _ in f if is_ambiguous(text)] for row, f in firsts.items()}
    nexts: dict[tuple[int, int], list[tuple[str, float]]] = {}
    while any(pending.values()):
        batch = {row: ids.pop(0) for row, ids in pending.items() if ids}
        logits = branch(batch)
        for row, tok in batch.items():
            allowed = allowed_tokens([branch_matcher(matchers[row], tok)], readout.vocab)[0]
            nexts[(row, tok)] = readout.after(logits[row], allowed)
    return {row: expected_value([(text, p, nexts.get((row, i))) for i, text, p in f]) for row, f in firsts.items()}
