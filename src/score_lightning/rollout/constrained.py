"""Constrained decoding of the evaluator's scoring turns (``evaluator.constrained_scoring``).

Why: one evaluation scores K reports x k dimensions, and a single missing or misnamed
``<score>`` makes the whole evaluation invalid (:mod:`~score_lightning.roles.evaluation`). A small
model, such as the CPU default's tiny one, writes the XML well but often does not copy the
step's freshly sampled dimension names and writes dimensions from its prior instead. Scoring tokens
are never trained in SCORE (REINFORCE trains the rubric tokens), so constraining them changes no
gradient. It only keeps the evaluator's *values* from being thrown away for a formatting slip. This
is the structured-output decoding (vLLM ``structured_outputs``) that LLM judges commonly use.

Each scoring turn is held to a grammar (Lark, as llguidance reads it): an optional ``<think>``, then either one
``<search>query</search>`` (while the tool budget allows) or the complete ``<report_evaluations>``
block with reports 1..K in order and one ``<score>`` per rubric dimension in rubric order. The
model still chooses whether to search, what to search for, every value 0-10 and every free-text
field. The engine applies the grammar: HF through :class:`GrammarLogitsProcessor` (llguidance
masks), vLLM through its ``structured_outputs`` with the ``guidance`` backend (the same library).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import llguidance
import llguidance.hf
import torch

from score_lightning import protocol as P

#: Longest free text per field, in characters (``evaluator.constrained_max_chars``). Without a cap a
#: small model can ramble in a free field until the turn's token budget ends and the evaluation is
#: cut off; a real judge needs room for its notes, so the defaults are generous and ``tiny_score``
#: tightens them to what its cold-start demos write (a few words per query, one short sentence per
#: section, one word per reason).
DEFAULT_MAX_CHARS = {"think": 2000, "query": 200, "section": 1000, "reason": 300}


class _Builder:
    """Turns grammar pieces into Lark: ("lit", text) exact text, ("rx", expr) a regex, ("opt", pieces), ("alt", [..])."""

    def __init__(self, max_chars: Mapping[str, int] | None, added: Mapping[str, int] | None):
        self.max_chars = {**DEFAULT_MAX_CHARS, **(max_chars or {})}
        bad = {k: v for k, v in self.max_chars.items() if k not in DEFAULT_MAX_CHARS or int(v) < 1}
        if bad:
            raise ValueError(f"evaluator.constrained_max_chars: unknown field or cap < 1: {bad} "
                             f"(fields: {sorted(DEFAULT_MAX_CHARS)})")
        self.added = dict(added or {})

    def free(self, field: str, exclude: str = "<") -> tuple[str, str]:
        """Free text of one field: no tag (``<``), at most ``max_chars[field]`` characters."""
        return ("rx", f"[^{exclude}]{{1,{int(self.max_chars[field])}}}")

    def section(self, open_tag: str, close_tag: str, required: bool) -> list:
        """``<tag>text</tag>``: text may be empty unless the process rules require the section."""
        cap = int(self.max_chars["section"])
        body = [("rx", f"[^<\\s][^<]{{0,{cap - 1}}}")] if required else _opt([self.free("section")])
        sec = [("lit", open_tag), *body, ("lit", close_tag)]
        return sec if required else _opt(sec)

    def evaluations(self, dims: Sequence[str], num_reports: int, require_verification: bool,
                    require_gap_analysis: bool) -> list:
        """The ``<report_evaluations>`` block :func:`~score_lightning.roles.evaluation.parse_evaluation` accepts
        as valid for these dimensions and K (sections the rules require are non-empty)."""
        out: list = [("lit", P.EVALS_OPEN)]
        for i in range(1, num_reports + 1):
            if i > 1:
                out += _opt([("lit", "\n")])
            out += [("lit", f'<report id="{i}">'), *self.section(P.VERIFICATION_OPEN, P.VERIFICATION_CLOSE, require_verification),
                    *self.section(P.GAP_OPEN, P.GAP_CLOSE, require_gap_analysis), ("lit", P.SCORES_OPEN)]
            for d in dims:
                out += [("lit", f'<score dim="{d}" value="'), ("rx", "(10|[0-9])"), ("lit", '"'),
                        *_opt([("lit", ' reason="'), *_opt([self.free("reason", '"<')]), ("lit", '"')]), ("lit", "/>")]
            out += [("lit", P.SCORES_CLOSE), ("lit", P.REPORT_CLOSE)]
        return out + [("lit", P.EVALS_CLOSE)]

    def literal(self, text: str) -> str:
        """``text`` in Lark: a tag the tokenizer holds as one added token becomes that token (``<[id]>``), since
        llguidance matches added tokens only by id; the rest are quoted strings."""
        if not self.added:
            return json.dumps(text)
        pattern = "|".join(re.escape(t) for t in sorted(self.added, key=len, reverse=True))
        parts, pos = [], 0
        for m in re.finditer(pattern, text):
            if m.start() > pos:
                parts.append(json.dumps(text[pos:m.start()]))
            parts.append(f"<[{self.added[m.group(0)]}]>")
            pos = m.end()
        if pos < len(text):
            parts.append(json.dumps(text[pos:]))
        return " ".join(parts)

    def lark(self, pieces: list) -> str:
        out = []
        for kind, val in pieces:
            if kind == "lit":
                out.append(self.literal(val))
            elif kind == "rx":
                out.append(f"/{val}/")
            elif kind == "opt":
                out.append(f"({self.lark(val)})?")
            else:  # "alt": a list of alternatives
                out.append("(" + " | ".join(self.lark(alt) for alt in val) + ")")
        return " ".join(out)


def _opt(pieces: list) -> list:
    return [("opt", pieces)]


def scoring_turn_grammar(dims: Sequence[str], num_reports: int, allow_search: bool, require_verification: bool = False,
                         require_gap_analysis: bool = False, added_tokens: Mapping[str, int] | None = None,
                         max_chars: Mapping[str, int] | None = None) -> str:
    """One scoring turn as a Lark grammar: optional think, then a search call (when ``allow_search``) or the
    evaluations block. ``added_tokens``: the tokenizer's non-special added tokens (text -> id)."""
    b = _Builder(max_chars, added_tokens)
    think = _opt([("lit", P.THINK_OPEN), *_opt([b.free("think")]), ("lit", P.THINK_CLOSE)])
    evals = b.evaluations(dims, num_reports, require_verification, require_gap_analysis)
    body = [("alt", [[("lit", P.SEARCH_OPEN), b.free("query", "<\\n"), ("lit", P.SEARCH_CLOSE)], evals])] \
        if allow_search else evals
    return "start: " + b.lark([*think, *body])


def text_added_tokens(tokenizer) -> dict[str, int]:
    """Added tokens that are text to the model (the protocol's tags in the tiny tokenizer), not control tokens."""
    dec = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return {t.content: int(i) for i, t in dec.items() if not t.special}


class ScoringConstraint:
    """Per-trajectory turn grammars for :func:`~score_lightning.rollout.agent.run_agent` (one rubric and K each)."""

    def __init__(self, dims: Sequence[str], num_reports: int, require_verification: bool = False,
                 require_gap_analysis: bool = False, added_tokens: Mapping[str, int] | None = None,
                 max_chars: Mapping[str, int] | None = None):
        args = (list(dims), int(num_reports))
        rules = (require_verification, require_gap_analysis, added_tokens, max_chars)
        self._with_search = scoring_turn_grammar(*args, True, *rules)
        self._final = scoring_turn_grammar(*args, False, *rules)

    def turn_grammar(self, can_search: bool) -> str:
        """The turn's grammar (Lark, as llguidance and vLLM's ``guidance`` backend read it)."""
        return self._with_search if can_search else self._final


# ---------------------------------------------------------------------------------------------- HF engine
_LL_TOKENIZERS: dict[tuple[int, int], Any] = {}


def ll_tokenizer(tokenizer, n_vocab: int, eos_ids: Sequence[int]):
    """llguidance's view of ``tokenizer`` with the model's vocabulary width (built once: ~1 s for 152k tokens)."""
    key = (id(tokenizer), int(n_vocab))
    if key not in _LL_TOKENIZERS:
        _LL_TOKENIZERS[key] = llguidance.hf.from_tokenizer(tokenizer, n_vocab=int(n_vocab), eos_token=list(eos_ids))
    return _LL_TOKENIZERS[key]


def _unpack(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[B, ceil(V/32)]`` int32 bit words -> ``[B, V]`` bool (bit j of word w allows token 32w + j)."""
    bits = torch.arange(32, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> bits) & 1).bool().reshape(bitmask.shape[0], -1)
    return allowed[:, :vocab]


class GrammarLogitsProcessor:
    """HF ``generate`` logits processor holding each row to its grammar (``None``: free).

    Rows are left-padded to ``prompt_width``; at each step the processor feeds the row's matcher
    the token sampled last, then masks every token the grammar cannot continue with. A row
    whose grammar is complete may only end (EOS); one whose matcher failed, which happens only once
    ``generate`` pads a finished row, is left alone.
    The mask must act before temperature and top-p (the engine orders them), or top-p could
    remove every allowed token.
    """

    def __init__(self, grammars: Sequence[str | None], tokenizer, eos_ids: Sequence[int], prompt_width: int):
        self.grammars, self.tokenizer, self.eos_ids = list(grammars), tokenizer, list(eos_ids)
        self.width = prompt_width
        self.matchers: list[Any] | None = None

    def _start(self, vocab: int) -> None:
        self.matchers = grammar_matchers(self.grammars, self.tokenizer, vocab, self.eos_ids)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        vocab = scores.shape[-1]
        if self.matchers is None:
            self._start(vocab)
        generated = input_ids.shape[1] - self.width
        rows = []
        for i, m in enumerate(self.matchers):
            if m is None or m.is_error():
                continue
            if generated > 0:
                m.consume_token(int(input_ids[i, -1]))  # after the row's EOS (padding) this errs: the row is done
                if m.is_error():
                    continue
            rows.append(i)  # a finished grammar (stopped) allows only EOS
        return mask_disallowed(scores, self.matchers, rows)


def grammar_matchers(grammars: Sequence[str | None], tokenizer, vocab: int, eos_ids: Sequence[int]) -> list[Any]:
    """One llguidance matcher per grammar (``None`` for a free row); a grammar that does not compile is refused."""
    tok = ll_tokenizer(tokenizer, vocab, eos_ids) if any(g is not None for g in grammars) else None
    out = []
    for grammar in grammars:
        if grammar is None:
            out.append(None)
            continue
        m = llguidance.LLMatcher(tok, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
        if m.is_error():
            raise ValueError(f"constrained scoring: bad grammar: {m.get_error()}")
        out.append(m)
    return out


def allowed_tokens(matchers: Sequence[Any], vocab: int) -> torch.Tensor:
    """``[len(matchers), V]`` bool: the tokens each matcher's grammar can continue with now."""
    # compute_bitmask, not llguidance.torch: importing that module costs ~2 s (it compiles a kernel) on every run
    bitmask = torch.stack([torch.frombuffer(bytearray(m.compute_bitmask()), dtype=torch.int32) for m in matchers])
    return _unpack(bitmask, vocab)


def mask_disallowed(scores: torch.Tensor, matchers: Sequence[Any], rows: Sequence[int],
                    allowed: torch.Tensor | None = None) -> torch.Tensor:
    """``scores [B, V]`` with -inf on every token row ``i`` (of ``rows``) may not write next (in place).
    ``allowed``: the rows' :func:`allowed_tokens`, when the caller already has them."""
    if not rows:
        return scores
    if allowed is None:
        allowed = allowed_tokens([matchers[i] for i in rows], scores.shape[-1])
    allowed = allowed.to(scores.device)
    idx = torch.tensor(list(rows), device=scores.device)
    scores[idx] = scores[idx].masked_fill(~allowed, float("-inf"))
    return scores
