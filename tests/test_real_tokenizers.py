"""Real checkpoints' conventions (Qwen2.5, Llama-3) and multi-token tag stops through the HF engine.

``load_tokenizer`` must give every caller the checkpoint's chat template, end-of-turn EOS and a pad
token, decode exactly, and refuse a checkpoint without a template. The HF engine must stop on a tag
that is several tokens, keep the token that completed it whole (``>\\n``), and sample from the
distribution the trainer scores, whatever ``generation_config.json`` says.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from chain_models import ANSWER_TURN, SEARCH_TURN, OneDoc, bigram_chain_model, chat_prompt, search_then_answer
from real_checkpoints import LLAMA3_CHAT_TEMPLATE, tokenizer_source
from score_lightning import protocol as P
from score_lightning.policy.models import end_of_turn_ids, load_policy, load_tokenizer
from score_lightning.roles.answer import parse_answer
from score_lightning.rollout.agent import AgentConfig, TagStops, run_agent
from score_lightning.rollout.engine import SamplingParams
from score_lightning.rollout.hf_engine import HFEngine

EXPECTED = {  # eos, end-of-turn ids (eos first), pad, the assistant-turn opener of the template
    "qwen": ("<|im_end|>", (151645, 151643), "<|endoftext|>", "<|im_start|>assistant\n"),
    "llama": ("<|eot_id|>", (128009, 128001, 128008), "<|eot_id|>", "<|start_header_id|>assistant<|end_header_id|>\n\n"),
}


@pytest.mark.parametrize("kind", ["qwen", "llama"])
def test_load_tokenizer_uses_the_checkpoint_conventions(kind, request):
    tok = request.getfixturevalue(f"{kind}_tokenizer")
    eos, ends, pad, opener = EXPECTED[kind]
    assert tok.eos_token == eos and end_of_turn_ids(tok) == ends and tok.pad_token == pad
    assert tok.padding_side == "left" and tok.clean_up_tokenization_spaces is False
    assert tok.decode(chat_prompt(tok, "hi")).endswith(opener)
    # every protocol tag is several tokens: the engines stop on strings, and on every end-of-turn id
    stops = TagStops(tok, [P.SEARCH_CLOSE, P.ANSWER_CLOSE])
    assert stops.strings == (P.SEARCH_CLOSE, P.ANSWER_CLOSE) and stops.token_ids == ends
    assert all(len(tok(t, add_special_tokens=False)["input_ids"]) > 1
               for t in P.PROTOCOL_TOKENS if t not in (P.THINK_OPEN, P.THINK_CLOSE))
    text = "a , b . c 's <answer>x</answer>."  # clean_up_tokenization_spaces would rewrite " ," and " ."
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text


def test_checkpoint_without_chat_template_is_refused_unless_one_is_given(tmp_path):
    """The Llama-3 files as a *base* checkpoint ships them: no template, EOS <|end_of_text|>."""
    src = tokenizer_source("llama3")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(src / name, tmp_path / name)
    with pytest.raises(ValueError, match=r"has no chat template.*model\.chat_template"):
        load_tokenizer(tmp_path)
    tok = load_tokenizer(tmp_path, chat_template=LLAMA3_CHAT_TEMPLATE)
    # the template ends turns with <|eot_id|>: it becomes the EOS; the configured one still stops
    assert tok.eos_token == "<|eot_id|>" and end_of_turn_ids(tok) == (128009, 128001)
    assert tok.pad_token == "<|finetune_right_pad_id|>"  # a pad it has is kept
    (tmp_path / "llama3.jinja").write_text(LLAMA3_CHAT_TEMPLATE)
    from_file = load_tokenizer(tmp_path, chat_template=str(tmp_path / "llama3.jinja"))
    assert from_file.chat_template == LLAMA3_CHAT_TEMPLATE
    with pytest.raises(ValueError, match="neither a Jinja template nor a file"):
        load_tokenizer(tmp_path, chat_template=str(tmp_path / "missing.jinja"))


def test_tokenizer_with_silently_empty_ids_is_refused(tokenizer, monkeypatch):
    """NOTES: a transformers release returned empty ``input_ids`` without error for a saved tokenizer."""

    class Broken:
        chat_template = "{{ messages }}"

        def __call__(self, text, **kw):
            return {"input_ids": []}

    monkeypatch.setattr("score_lightning.policy.models.AutoTokenizer.from_pretrained", lambda path: Broken())
    with pytest.raises(RuntimeError, match="does not round-trip"):
        load_tokenizer("any")


@pytest.mark.parametrize("kind", ["qwen", "llama"])
def test_hf_engine_stops_on_multi_token_tags_and_the_loop_reads_them(kind, request):
    ckpt = request.getfixturevalue(f"{kind}_ckpt")
    tok, model = load_tokenizer(ckpt), load_policy(ckpt).eval()
    prompt = search_then_answer(model, tok)
    engine = HFEngine(lambda: model, tok.pad_token_id, tok.eos_token_id, tok)
    # a stop string ending inside a token: the whole token (">\n") is returned, the row stops there
    short, long_ = prompt, prompt[2:]  # different lengths: the shorter row is left-padded
    gens = engine.generate([short, long_], SamplingParams(24, temperature=0.0, stop_strings=(P.SEARCH_CLOSE,)))
    for g in gens:
        assert g.finish_reason == "stop" and tok.decode(g.token_ids) == SEARCH_TURN
        assert len(g.logprobs) == len(g.token_ids) and all(lp > -1e-3 for lp in g.logprobs)
    cfg = AgentConfig(max_tool_calls=1, max_response_tokens=96, max_observation_tokens=32, temperature=1.0)
    traj = run_agent(engine, tok, [prompt], OneDoc(), cfg)[0]
    assert traj.finished and not traj.truncated and traj.invalid_actions == 0
    assert traj.tool_calls == 1 and traj.search_queries == ["json"] and traj.retrieved_ids == ["json.dumps"]
    text = traj.model_text(tok)
    # the final turn may only answer: it searches again in text (not an action), then answers
    assert text == SEARCH_TURN * 2 + ANSWER_TURN
    parsed = parse_answer(text, traj.truncated, require_citation=True)
    assert parsed.valid and parsed.cited_ids == ("json.dumps",)


def test_hf_engine_samples_without_the_checkpoint_sampling_defaults(qwen_ckpt):
    """Qwen2.5's generation_config (repetition_penalty 1.05, top_k 20, top_p 0.8) must not reach generate():
    greedy output is the plain argmax, as vLLM's and as the trainer's log-probs assume.

    The model is edited so that after token X the argmax is X again (logit ~81.6), with Y close behind
    (~80): a repetition penalty of 1.05 on the X already in context would turn the first step into Y.
    """
    tok, model = load_tokenizer(qwen_ckpt), load_policy(qwen_ckpt).eval()
    assert model.generation_config.repetition_penalty == 1.05
    x, y = (tok(w, add_special_tokens=False)["input_ids"][0] for w in ("json", "pickle"))
    bigram_chain_model(model, [x, y])  # x -> y at ~80
    with torch.no_grad():
        model.lm_head.weight[x] = 10.2 * torch.nn.functional.one_hot(torch.tensor(0), model.config.hidden_size).float()
    prompt = chat_prompt(tok, "Tell me about json.") + [x]
    engine = HFEngine(lambda: model, tok.pad_token_id, tok.eos_token_id, tok)
    got = engine.generate([prompt], SamplingParams(6, temperature=0.0))[0].token_ids
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(len(got)):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    assert got == ids[len(prompt):] == [x] * 6
    assert model.generation_config.repetition_penalty == 1.05  # restored after the call


PARSER_TEXTS = {
    "answer": "<think>check , then cite .</think><answer>json.dumps escapes non-ASCII [json.dumps] , by default"
              " (ensure_ascii=True) [json.JSONEncoder].\n\nConclusion: pass ensure_ascii=False to keep “naïve” text.</answer>",
    "rubric": '<think>k=2</think><dimensions><dim name="factual_support" weight="0.60"/>'
              "<dim name='insight' weight=0.40 /></dimensions>",
    "evaluation": '<report_evaluations><report id="1"><verification>ok .</verification><gap_analysis>none ,'
                  '</gap_analysis><scores><score dim="factual_support" value="8" reason="cites [json.dumps] ."/>'
                  '<score dim="insight" value="6.5"/></scores></report></report_evaluations>',
    "search": "<think>need docs .</think><search> json dumps unicode </search>",
}


@pytest.mark.parametrize("kind", ["qwen", "llama"])
def test_parsers_read_text_decoded_from_real_ids(kind, request):
    """Every parser gives the same result on text decoded from Qwen / Llama ids (EOS included) as on the text."""
    from score_lightning.harness.state import HarnessState
    from score_lightning.roles.answer import extract_conclusion
    from score_lightning.roles.evaluation import parse_evaluation
    from score_lightning.roles.rubric import Rubric, parse_rubric, rubric_token_span
    from score_lightning.rollout.agent import parse_search_action

    tok = request.getfixturevalue(f"{kind}_tokenizer")
    state = HarnessState.from_dict({"dimension_constraints": {"k": 2, "must_include": [], "weight_min": 0.1,
                                                              "weight_max": 0.9}})
    rubric = Rubric(("factual_support", "insight"), (0.6, 0.4))
    parsers = {
        "answer": lambda t: (parse_answer(t, require_citation=True), extract_conclusion(parse_answer(t).answer or "")),
        "rubric": lambda t: parse_rubric(t, state),
        "evaluation": lambda t: parse_evaluation(t, rubric, 1, require_verification=True, require_gap_analysis=True),
        "search": parse_search_action,
    }
    for name, text in PARSER_TEXTS.items():
        ids = tok(text, add_special_tokens=False)["input_ids"]
        decoded = tok.decode(ids + [tok.eos_token_id])
        assert decoded == text + tok.eos_token
        assert parsers[name](decoded) == parsers[name](text + tok.eos_token) == parsers[name](text), name
    answer = parsers["answer"](PARSER_TEXTS["answer"])
    assert answer[0].valid and answer[0].cited_ids == ("json.dumps", "json.JSONEncoder")
    assert answer[1] == "pass ensure_ascii=False to keep “naïve” text."
    assert parsers["rubric"](PARSER_TEXTS["rubric"]).valid and parsers["evaluation"](PARSER_TEXTS["evaluation"]).valid
    # REINFORCE's rubric span ends on the token that completes </dimensions>, found on decoded text
    ids = tok(PARSER_TEXTS["rubric"] + " trailing words", add_special_tokens=False)["input_ids"]
    end = rubric_token_span(ids, tok.decode)[1]
    assert tok.decode(ids[:end]).endswith("</dimensions>") and "</dimensions>" not in tok.decode(ids[:end - 1])
