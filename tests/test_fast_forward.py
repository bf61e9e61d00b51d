"""Constrained decoding with fast-forward (``rollout.grammar_fast_forward``): the grammar's forced tokens enter the
model in one forward, and the result is what token-by-token masking inside ``generate`` gives.

Checked against independent computations: the masked ``generate`` path of the same engine (greedy ids), a plain
teacher-forced forward of prompt + output (log-probs), and the grammar itself (every output parses).
"""

from __future__ import annotations

import pytest
import torch

from score_lightning.roles.evaluation import parse_evaluation
from score_lightning.roles.rubric import Rubric
from score_lightning.rollout import fast_forward as FF
from score_lightning.rollout.constrained import ScoringConstraint, text_added_tokens
from score_lightning.rollout.engine import SamplingParams
from score_lightning.rollout.hf_engine import HFEngine

RUBRICS = [Rubric(("factual_support", "citation_grounding"), (0.6, 0.4)),
           Rubric(("insight", "conciseness", "factual_support"), (0.3, 0.3, 0.4))]
CAPS = {"think": 40, "query": 30, "section": 40, "reason": 12}


def _setup(ckpt):
    from score_lightning.policy.models import load_policy, load_tokenizer

    tok = load_tokenizer(ckpt)
    torch.manual_seed(0)
    model = load_policy(ckpt)
    prompts = [tok("Score the reports.", add_special_tokens=False)["input_ids"],
               tok("Judge them, please now.", add_special_tokens=False)["input_ids"]]
    return tok, model, prompts


def _grammars(tok, searching: bool) -> tuple[str, ...]:
    added = text_added_tokens(tok)
    return tuple(ScoringConstraint(r.dims, 2, added_tokens=added, max_chars=CAPS).turn_grammar(searching)
                 for r in RUBRICS)


def _count_forwards(monkeypatch) -> list[int]:
    seen: list[int] = []
    real = FF.grammar_decode

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        seen.append(out.forwards)
        return out

    monkeypatch.setattr(FF, "grammar_decode", spy)
    return seen


@pytest.mark.parametrize("which,budget", [("tiny_ckpt", 64), ("qwen_ckpt", 64), ("tiny_ckpt", 5), ("qwen_ckpt", 3)])
def test_greedy_fast_forward_equals_masking_token_by_token(which, budget, request, monkeypatch):
    """Same ids, same log-probs, far fewer forwards, for a search turn (stopped by a multi-token string on Qwen)
    and an evaluation turn, two rows with different rubrics in one batch. Tiny: tags are added tokens; Qwen2.5:
    BPE text. A small ``fast_forward_tokens`` cuts the forced runs over several forwards (3 over 2 rows: one
    token per row and forward while both decode)."""
    tok, model, prompts = _setup(request.getfixturevalue(which))
    forwards = _count_forwards(monkeypatch)
    for searching in (True, False):
        grammars = _grammars(tok, searching)
        params = SamplingParams(400, temperature=0.0, stop_strings=("</search>",) if searching else (),
                                grammars=grammars)
        fast = HFEngine(lambda: model, tok.pad_token_id, tok.eos_token_id, tok,
                        fast_forward_tokens=budget).generate(prompts, params)
        slow = HFEngine(lambda: model, tok.pad_token_id, tok.eos_token_id, tok, fast_forward=False).generate(
            prompts, params)
        for f, s, rubric in zip(fast, slow, RUBRICS):
            assert f.token_ids == s.token_ids and f.finish_reason == s.finish_reason == "stop"
            torch.testing.assert_close(torch.tensor(f.logprobs), torch.tensor(s.logprobs), atol=1e-4, rtol=0)
            if not searching:
                assert parse_evaluation(tok.decode(f.token_ids), rubric, 2).valid
        longest = max(len(f.token_ids) for f in fast)
        if searching:
            continue
        if budget == 64:  # a forward per free token only: the tags and dimension names were forced
            assert forwards[-1] < 0.6 * longest, (forwards, [len(f.token_ids) for f in fast])
        elif budget == 5:  # two tokens per row and forward: fewer forwards than tokens, more than with 64
            assert 0.5 * longest <= forwards[-1] < longest, (forwards, [len(f.token_ids) for f in fast])
        else:  # one token per row and forward while both rows decode (3 // 2), three once one is done
            shortest = min(len(f.token_ids) for f in fast)
            assert shortest <= forwards[-1] <= longest, (forwards, [len(f.token_ids) for f in fast])
    assert len(forwards) == 2


def test_sampled_log_probs_are_the_unconstrained_ones_of_a_plain_forward(tiny_ckpt):
    """Sampling at T=0.7, top-p 0.9: each token's log-prob, forced ones included, equals log_softmax(logits / T) of
    one teacher-forced forward over prompt + output; every row parses."""
    tok, model, prompts = _setup(tiny_ckpt)
    engine = HFEngine(lambda: model, tok.pad_token_id, tok.eos_token_id, tok, fast_forward_tokens=9)  # runs cut
    torch.manual_seed(3)
    gens = engine.generate(prompts, SamplingParams(600, temperature=0.7, top_p=0.9, grammars=_grammars(tok, False)))
    for g, p, rubric in zip(gens, prompts, RUBRICS):
        assert parse_evaluation(tok.decode(g.token_ids), rubric, 2).valid
        ids = torch.tensor([p + g.token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(p) - 1:-1].float() / 0.7
        want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(g.token_ids).view(-1, 1)).view(-1)
        torch.testing.assert_close(torch.tensor(g.logprobs), want, atol=1e-4, rtol=0)


def test_next_turn_reuses_the_compacted_cache(tiny_ckpt, monkeypatch):
    """The cache of a fast-forwarded turn (holes squeezed out) serves the row's next turn: the prefill runs only
    the new tokens, and the greedy result equals a fresh engine's."""
    from score_lightning.rollout import kv_cache

    tok, model, prompts = _setup(tiny_ckpt)
    params = SamplingParams(60, temperature=0.0, stop_strings=("</search>",), grammars=_grammars(tok, True))
    engine = HFEngine(lambda: model, tok.pad_token_id, tok.eos_token_id, tok)
    first = engine.generate(prompts, params)
    observation = tok("\n<observation>json.dumps writes JSON</observation>\n", add_special_tokens=False)["input_ids"]
    nxt = [p + g.token_ids + observation for p, g in zip(prompts, first)]
    computed: list[int] = []
    real = kv_cache.prefill
    monkeypatch.setattr("score_lightning.rollout.hf_engine.prefill",
                        lambda *a, **k: computed.append(real(*a, **k)) or computed[-1])
    final = replace_grammars(params, _grammars(tok, False), 300)
    reused = engine.generate(nxt, final)
    fresh = HFEngine(lambda: model, tok.pad_token_id, tok.eos_token_id, tok).generate(nxt, final)
    assert [g.token_ids for g in reused] == [g.token_ids for g in fresh]
    width = max(len(x) for x in nxt)
    # with the stored prefixes only the columns some row lacks run (at most the longer observation's), not all
    assert computed[0] < len(nxt) * (width - 1) / 2, (computed, width)


def replace_grammars(params: SamplingParams, grammars, max_new: int) -> SamplingParams:
    from dataclasses import replace

    return replace(params, grammars=grammars, stop_strings=(), max_new_tokens=max_new)


def test_free_rows_length_cap_and_the_switch(tiny_ckpt, monkeypatch):
    """A row without a grammar decodes as ``generate`` does; ``max_new_tokens`` caps a forced run; the switch off
    (and a collective engine) takes ``generate``."""
    tok, model, prompts = _setup(tiny_ckpt)
    forwards = _count_forwards(monkeypatch)
    grammars = (None, _grammars(tok, False)[1])
    params = SamplingParams(40, temperature=0.0, grammars=grammars)
    fast = HFEngine(lambda: model, tok.pad_token_id, tok.eos_token_id, tok).generate(prompts, params)
    free = HFEngine(lambda: model, tok.pad_token_id, tok.eos_token_id, tok).generate(
        prompts[:1], SamplingParams(40, temperature=0.0))
    assert fast[0].token_ids == free[0].token_ids
    assert len(fast[1].token_ids) == 40 and fast[1].finish_reason == "length" and len(fast[1].logprobs) == 40
    assert len(forwards) == 1
    HFEngine(lambda: model, tok.pad_token_id, tok.eos_token_id, tok, fast_forward=False).generate(prompts, params)
    assert len(forwards) == 1  # the switch off: generate() with the masking processor
    assert HFEngine(lambda: model, tok.pad_token_id, tok.eos_token_id, tok, collective=True).fast_forward is False


def test_compact_keeps_each_rows_real_columns_in_order():
    """``compact`` against a hand-built cache: row 0 has holes at columns 1 and 3, row 1 at none."""
    from score_lightning.rollout.kv_cache import GrowingCache

    cache = GrowingCache(8)
    k = torch.arange(2 * 5, dtype=torch.float32).view(2, 1, 5, 1)
    cache.update(k, -k, 0)
    mask = torch.tensor([[1, 0, 1, 0, 1], [1, 1, 1, 1, 1]])
    FF.compact(cache, mask)
    keys, values = cache.layers[0].keys, cache.layers[0].values
    assert keys.shape == (2, 1, 5, 1)
    assert keys[0, 0, 2:, 0].tolist() == [0.0, 2.0, 4.0] and keys[1, 0, :, 0].tolist() == [5.0, 6.0, 7.0, 8.0, 9.0]
    assert torch.equal(values, -keys)
    ids, keep = FF._compact_ids(torch.tensor([[7, 0, 8, 0, 9], [1, 2, 3, 4, 5]]), mask)
    assert ids.tolist() == [[0, 0, 7, 8, 9], [1, 2, 3, 4, 5]] and keep.tolist() == [[0, 0, 1, 1, 1], [1] * 5]
