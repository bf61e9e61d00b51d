"""The tiny checkpoint: tokenizer round trip (a silent empty tokenisation poisons everything), tags, caching."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from score_lightning import protocol as P
from score_lightning.policy.models import TinyModelSpec, build_tiny_model, ensure_tiny_checkpoint


def test_saved_tokenizer_round_trips_exactly(tiny_ckpt):
    tok = AutoTokenizer.from_pretrained(str(tiny_ckpt))
    text = 'Use json.dumps(obj, ensure_ascii=False) <search>pickle vs json</search>\n<answer>[json.dumps] ok</answer>'
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) > 10
    assert tok.decode(ids) == text


def test_protocol_tags_are_single_tokens(tokenizer):
    for tag in P.PROTOCOL_TOKENS + (P.IM_END, P.IM_START):
        assert len(tokenizer(tag, add_special_tokens=False)["input_ids"]) == 1, tag
    assert tokenizer.eos_token == P.IM_END
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_checkpoint_is_cached_and_rebuilt_when_inputs_change(tmp_path, corpus_file):
    small = TinyModelSpec(vocab_size=600, hidden_size=64, intermediate_size=128, num_attention_heads=2)
    a = ensure_tiny_checkpoint(tmp_path, small, corpus_file)
    mtime = (a / "config.json").stat().st_mtime_ns
    assert ensure_tiny_checkpoint(tmp_path, small, corpus_file) == a  # reused
    assert (a / "config.json").stat().st_mtime_ns == mtime
    b = ensure_tiny_checkpoint(tmp_path, TinyModelSpec(vocab_size=600, hidden_size=64, intermediate_size=128,
                                                       num_attention_heads=2, seed=1), corpus_file)
    assert b != a  # the seed is an input: a new checkpoint
    ma = AutoModelForCausalLM.from_pretrained(str(a))
    mb = AutoModelForCausalLM.from_pretrained(str(b))
    assert not torch.equal(ma.lm_head.weight, mb.lm_head.weight)
    assert ma.config.tie_word_embeddings is False


def test_model_build_is_deterministic_and_head_dim_checked(tokenizer):
    spec = TinyModelSpec(hidden_size=64, intermediate_size=128, num_attention_heads=2)
    m1, m2 = build_tiny_model(spec, tokenizer), build_tiny_model(spec, tokenizer)
    assert all(torch.equal(p, q) for p, q in zip(m1.parameters(), m2.parameters()))
    import pytest

    with pytest.raises(ValueError, match="head_dim=16"):
        build_tiny_model(TinyModelSpec(hidden_size=64, num_attention_heads=4, num_key_value_heads=1), tokenizer)
