"""The multi-turn agent loop: exact token bookkeeping, masks, malformed actions, budgets, failures."""

from __future__ import annotations

import torch

from score_lightning import protocol as P
from score_lightning.retrieval.base import RetrievalError, SearchHit
from score_lightning.rollout.agent import AgentConfig, parse_search_action, run_agent
from score_lightning.rollout.engine import SamplingParams
from score_lightning.rollout.hf_engine import HFEngine
from score_lightning.rollout.scripted import ScriptedEngine as LibraryScriptedEngine


class ScriptedEngine(LibraryScriptedEngine):
    """The library's scripted engine, fed turn by turn: trajectory i (by first appearance of its
    prompt) replays ``scripts[i]``. ``calls`` records every call's sampling parameters."""

    def __init__(self, tokenizer, scripts: list[list[str]]):
        self.scripts, self.calls, self.order = [list(s) for s in scripts], [], {}
        super().__init__(tokenizer, lambda req: self.scripts[self.order.setdefault(req.prompt, len(self.order))].pop(0))

    def generate(self, prompts, params: SamplingParams):
        self.calls.append(params)
        return super().generate(prompts, params)


class FakeRetriever:
    def __init__(self, fail: bool = False):
        self.fail, self.queries = fail, []

    def search(self, queries, topk):
        self.queries.extend(queries)
        if self.fail:
            raise RetrievalError("http://127.0.0.1:9/retrieve: connection refused after 3 attempts")
        return [[SearchHit(f"doc.{q.split()[0]}", f'"doc.{q.split()[0]}"\npassage about {q}', 1.0)][:topk] for q in queries]


def _prompt(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_observation_tokens_are_exactly_the_masked_ones(tokenizer):
    tok = tokenizer
    scripts = [[
        "<think>need docs</think><search>json dumps</search>",
        "<search>pickle loads</search>",
        "<answer>JSON is text [doc.json]. Conclusion: use json.</answer>",
    ]]
    engine = ScriptedEngine(tok, scripts)
    traj = run_agent(engine, tok, [_prompt(tok, "question one")], FakeRetriever(), AgentConfig(max_tool_calls=4, max_response_tokens=400))[0]
    assert traj.finished and not traj.truncated
    assert traj.tool_calls == 2 and traj.search_queries == ["json dumps", "pickle loads"]
    assert traj.retrieved_ids == ["doc.json", "doc.pickle"]
    # decode the masked-out spans: exactly the two observations, nothing else
    spans, cur = [], []
    for t, m in zip(traj.response_ids, traj.response_mask):
        if m == 0:
            cur.append(t)
        elif cur:
            spans.append(tok.decode(cur)), cur.clear()
    assert len(spans) == 2
    for s, q in zip(spans, ["json dumps", "pickle loads"]):
        assert s.strip().startswith(P.OBS_OPEN) and s.strip().endswith(P.OBS_CLOSE)
        assert f"passage about {q}" in s
    model_text = traj.model_text(tok)
    assert P.OBS_OPEN not in model_text and P.OBS_CLOSE not in model_text
    assert tok.decode([t for t, m in zip(traj.response_ids, traj.response_mask) if m]) == \
        "<think>need docs</think><search>json dumps</search><search>pickle loads</search>" \
        "<answer>JSON is text [doc.json]. Conclusion: use json.</answer>"
    # decoding all ids gives the full text: generated turns interleaved with observations
    full = traj.response_text(tok)
    assert full.startswith("<think>need docs</think><search>json dumps</search>\n<observation>")
    assert full.endswith("<answer>JSON is text [doc.json]. Conclusion: use json.</answer>")
    assert len(traj.engine_logprobs) == len(traj.response_ids)
    assert all(lp == 0.0 for lp, m in zip(traj.engine_logprobs, traj.response_mask) if m == 0)


def test_malformed_actions_get_invalid_observation_and_are_counted(tokenizer):
    tok = tokenizer
    scripts = [
        ["<search>   </search>", "<search>a<search>b</search>", "<answer>fine answer text here.</answer>"],
    ]
    retr = FakeRetriever()
    traj = run_agent(ScriptedEngine(tok, scripts), tok, [_prompt(tok, "q")], retr, AgentConfig(max_tool_calls=5, max_response_tokens=400))[0]
    assert traj.invalid_actions == 2 and traj.tool_calls == 2 and retr.queries == []
    assert traj.response_text(tok).count(P.INVALID_ACTION_OBSERVATION) == 2
    assert traj.finished


def test_parse_search_action_cases():
    assert parse_search_action("<think>x</think><search>json</search>").query == "json"
    assert parse_search_action("<search></search>").kind == "invalid"
    assert parse_search_action("json</search>").kind == "invalid"
    assert parse_search_action("<search>a<search>b</search>").reason == "two queries in one search call"
    assert parse_search_action("<search>a</search> then <search>b</search>").query == "b"


def test_tool_budget_then_final_turn_cannot_search(tokenizer):
    tok = tokenizer
    scripts = [["<search>one</search>", "<search>two</search>", "<answer>done with two searches.</answer>"]]
    engine = ScriptedEngine(tok, scripts)
    traj = run_agent(engine, tok, [_prompt(tok, "q")], FakeRetriever(), AgentConfig(max_tool_calls=2, max_response_tokens=400))[0]
    assert traj.tool_calls == 2 and traj.finished
    assert P.TOOL_BUDGET_OBSERVATION in traj.response_text(tok)
    search_close = tok.convert_tokens_to_ids(P.SEARCH_CLOSE)
    assert search_close in engine.calls[0].stop_token_ids
    assert search_close not in engine.calls[-1].stop_token_ids  # final turn may only answer


def test_evaluator_notices_name_its_own_finish_tag(tokenizer):
    """An evaluator (finish tag </report_evaluations>) is never told to write an <answer>."""
    tok = tokenizer
    scripts = [["<search></search>", "<search>two</search>", "<report_evaluations></report_evaluations>"]]
    cfg = AgentConfig(max_tool_calls=2, max_response_tokens=400, finish_tag=P.EVALS_CLOSE)
    traj = run_agent(ScriptedEngine(tok, scripts), tok, [_prompt(tok, "q")], FakeRetriever(), cfg)[0]
    text = traj.response_text(tok)
    assert traj.finished and traj.invalid_actions == 1
    assert P.invalid_action_observation(P.EVALS_CLOSE) in text and P.tool_budget_observation(P.EVALS_CLOSE) in text
    assert "<report_evaluations></report_evaluations>." in P.tool_budget_observation(P.EVALS_CLOSE)
    assert P.ANSWER_OPEN not in text.replace("<report_evaluations></report_evaluations>", "")


class LongRetriever(FakeRetriever):
    """Every search returns one long passage (its observation is cut to max_observation_tokens)."""

    def search(self, queries, topk):
        return [[SearchHit(f"doc{i}", '"t"\n' + "evidence words " * 100, 1.0)] for i, _ in enumerate(queries)]


def test_scoring_observations_do_not_eat_the_generation_budget(tokenizer):
    """With observations_in_budget=False (the evaluator's scoring loop) five 40-token observations do
    not count against max_response_tokens: the model still has its whole budget to write the evaluation."""
    tok = tokenizer
    evaluation = "<report_evaluations>" + "scored " * 8 + "</report_evaluations>"
    scripts = [[f"<search>check {i}</search>" for i in range(5)] + [evaluation]]
    shared = AgentConfig(max_tool_calls=5, max_response_tokens=80, max_observation_tokens=40, finish_tag=P.EVALS_CLOSE)
    kept = run_agent(ScriptedEngine(tok, scripts), tok, [_prompt(tok, "q")], LongRetriever(), shared)[0]
    assert kept.truncated and not kept.finished  # observations counted: the searches used up the room
    own = AgentConfig(max_tool_calls=5, max_response_tokens=80, max_observation_tokens=40, finish_tag=P.EVALS_CLOSE,
                      observations_in_budget=False)
    engine = ScriptedEngine(tok, [list(scripts[0])])
    traj = run_agent(engine, tok, [_prompt(tok, "q")], LongRetriever(), own)[0]
    assert traj.finished and not traj.truncated and traj.tool_calls == 5
    assert traj.num_model_tokens <= 80 < len(traj.response_ids)
    assert P.EVALS_CLOSE in traj.model_text(tok)
    # each turn's budget is what the model has left of its own tokens, whatever it has read
    written = [len(tok(f"<search>check {i}</search>", add_special_tokens=False)["input_ids"]) for i in range(5)]
    assert [c.max_new_tokens for c in engine.calls] == [80 - sum(written[:i]) for i in range(6)]


def test_truncation_and_retrieval_failure(tokenizer):
    tok = tokenizer
    long = "word " * 200
    scripts = [["<search>x</search>", "<answer>" + long], ["<answer>short but valid answer</answer>"]]
    trajs = run_agent(ScriptedEngine(tok, scripts), tok, [_prompt(tok, "first"), _prompt(tok, "second")],
                      FakeRetriever(fail=True), AgentConfig(max_tool_calls=3, max_response_tokens=60))
    assert trajs[0].truncated and not trajs[0].finished and len(trajs[0].response_ids) == 60
    assert trajs[0].retrieval_errors == 1
    assert P.RETRIEVAL_FAILED_OBSERVATION in trajs[0].response_text(tok)
    assert trajs[1].finished and not trajs[1].truncated


def test_real_hf_engine_agent_loop_keeps_generated_ids(tiny_ckpt, tokenizer, bm25):
    from score_lightning.policy.models import load_policy

    torch.manual_seed(0)
    model = load_policy(tiny_ckpt)
    recorded = []

    class Recording(HFEngine):
        def generate(self, prompts, params):
            gens = super().generate(prompts, params)
            recorded.extend(g.token_ids for g in gens)
            return gens

    eng = Recording(lambda: model, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer)
    prompts = [_prompt(tokenizer, "How does json.dumps handle unicode?")] * 3
    trajs = run_agent(eng, tokenizer, prompts, bm25, AgentConfig(max_tool_calls=2, max_response_tokens=48, temperature=1.0))
    gen_ids = sorted(map(tuple, recorded))
    for t in trajs:
        assert len(t.response_ids) == len(t.response_mask) == len(t.engine_logprobs) <= 48
        assert t.finished or t.truncated
        model_ids = [x for x, m in zip(t.response_ids, t.response_mask) if m]
        assert model_ids, "the model generated nothing"
        assert all(lp <= 0.0 for lp, m in zip(t.engine_logprobs, t.response_mask) if m)
    # every generated segment appears verbatim in some trajectory (no re-tokenisation)
    assert sum(len(g) for g in gen_ids) == sum(t.num_model_tokens for t in trajs)


def test_stop_rules_for_tags_split_into_several_tokens(qwen_tokenizer):
    """Where a turn stops and which tag ended it, when ``</search>`` is ``</`` ``search`` ``>\\n`` (Qwen2.5)."""
    from score_lightning.rollout.stops import completed_tag, first_stop

    tok = qwen_tokenizer
    ids = _prompt(tok, "<think>x</think><search>json</search>\nmore words")
    n = first_stop(ids, tok.decode, (), (P.SEARCH_CLOSE,))
    turn = tok.decode(ids[:n])
    assert turn == "<think>x</think><search>json</search>\n"  # the token completing the tag is kept whole
    assert first_stop(ids, tok.decode, (ids[2],), (P.SEARCH_CLOSE,)) == 3  # a stop id before the string wins
    assert first_stop(ids, tok.decode, (), (P.ANSWER_CLOSE,)) is None
    assert completed_tag(ids[:n], tok.decode, (P.SEARCH_CLOSE, P.ANSWER_CLOSE)) == (P.SEARCH_CLOSE, len(turn) - 1)
    assert completed_tag(ids[:n + 1], tok.decode, (P.SEARCH_CLOSE,)) is None  # completed before the last token
    assert completed_tag(ids[:n - 1], tok.decode, (P.SEARCH_CLOSE,)) is None  # not complete yet


def test_sampled_logprobs_drop_the_synced_forwards_after_a_rank_finished():
    """Under FSDP every rank runs ``generate`` with ``synced_gpus``: a rank that finished first keeps running
    forwards (no new tokens) until all are done. The recorder keeps one column per real token."""
    from types import SimpleNamespace

    from score_lightning.rollout.hf_engine import _SampledLogprobs

    torch.manual_seed(0)
    logits = [torch.randn(2, 7) for _ in range(5)]
    tokens = torch.tensor([[3, 1, 4], [2, 6, 5]])  # 3 real tokens, then 2 synced forwards that add none
    rec = _SampledLogprobs(temperature=1.0)
    inputs = [torch.tensor([[9], [9]])] + [tokens[:, j:j + 1] for j in range(3)] + [tokens[:, 2:3]]
    for step, ids in enumerate(inputs):
        rec(None, (), {"input_ids": ids}, SimpleNamespace(logits=logits[step].unsqueeze(1)))
    got = rec.finish(tokens)
    want = torch.stack([torch.log_softmax(logits[j], -1).gather(-1, tokens[:, j:j + 1]).squeeze(-1) for j in range(3)], 1)
    assert got.shape == (2, 3) and torch.allclose(got, want)


def test_a_hit_cut_out_of_the_observation_was_not_retrieved(tokenizer):
    """"Retrieved" means shown: with a budget that keeps only the first passage's line head, the second hit's
    id is not among the trajectory's retrieved ids, so citing it is citing what the model never saw."""
    from score_lightning.rollout.agent import format_observation

    tok = tokenizer
    hits = [SearchHit("doc.first", '"doc.first"\n' + "first passage text " * 20, 2.0),
            SearchHit("doc.second", '"doc.second"\nsecond passage', 1.0)]
    ids, shown = format_observation(hits, 12, tok)
    assert shown == ["doc.first"] and "[doc.second]" not in tok.decode(ids)
    _, both = format_observation(hits, 4096, tok)
    assert both == ["doc.first", "doc.second"]

    class TwoHits(FakeRetriever):
        def search(self, queries, topk):
            return [hits for _ in queries]

    engine = ScriptedEngine(tok, [["<search>first second</search>", "<answer>It reads [doc.first] [doc.second].</answer>"]])
    traj = run_agent(engine, tok, [_prompt(tok, "question")], TwoHits(),
                     AgentConfig(max_tool_calls=2, max_response_tokens=400, max_observation_tokens=12))[0]
    assert traj.retrieved_ids == ["doc.first"]
