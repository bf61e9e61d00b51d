"""``HFEngine(ignore_eos=True)``: every row runs to ``max_new_tokens``, no stop id or string ends it early."""

from __future__ import annotations

import pytest

from score_lightning.rollout.engine import SamplingParams
from score_lightning.rollout.hf_engine import HFEngine


@pytest.fixture(scope="module")
def model(tiny_ckpt):
    from score_lightning.policy.models import load_policy

    return load_policy(tiny_ckpt, "float32").eval()


def _prompts(tokenizer) -> list[list[int]]:
    a = tokenizer("<think>the json module</think> reads", add_special_tokens=False)["input_ids"]
    b = tokenizer("python data files", add_special_tokens=False)["input_ids"]
    return [a, b, a]


def test_stop_ids_and_strings_end_nothing_and_are_never_sampled(model, tokenizer):
    prompts = _prompts(tokenizer)
    plain = HFEngine(lambda: model, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer, 64)
    free = plain.generate(prompts, SamplingParams(12, 0.0, logprobs=False))
    # stop on the token row 0 writes third (greedy): the plain engine ends row 0 there
    stop = free[0].token_ids[2]
    text = tokenizer.decode(free[1].token_ids[3:5])  # a string row 1 writes: the plain engine stops on it
    params = SamplingParams(12, 0.0, stop_token_ids=(stop,), stop_strings=(text,), logprobs=True)
    stopped = plain.generate(prompts, params)
    assert len(stopped[0].token_ids) <= 3 and stopped[0].finish_reason == "stop"
    assert len(stopped[1].token_ids) <= 5 and stopped[1].finish_reason == "stop"

    forced = HFEngine(lambda: model, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer, 64, ignore_eos=True)
    gens = forced.generate(prompts, params)
    masked = {stop, *forced.eos_token_ids}
    for g in gens:
        assert len(g.token_ids) == 12 and g.finish_reason == "length" and len(g.logprobs) == 12
        assert not masked & set(g.token_ids)  # masked out of sampling, not merely not stopped on
    assert gens[0].token_ids[:2] == free[0].token_ids[:2]  # the same greedy path until the masked token
    assert gens[1].token_ids[:5] == free[1].token_ids[:5]  # a stop string is written and run past
    # sampled rows too: each row is exactly max_new_tokens long
    sampled = forced.generate(prompts, SamplingParams(20, 1.0, stop_token_ids=(stop,)))
    assert [len(g.token_ids) for g in sampled] == [20, 20, 20]
    assert not any(masked & set(g.token_ids) for g in sampled)


def test_constrained_calls_are_refused(model, tokenizer):
    forced = HFEngine(lambda: model, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer, 64, ignore_eos=True)
    with pytest.raises(ValueError, match="ignore_eos"):
        forced.generate(_prompts(tokenizer)[:1], SamplingParams(4, 0.0, grammars=('start: "a"',)))
