"""DR-rubric (``rubric=drrubric``): Stage I research, Stage II distillation to atomic items, and the bootstrap
iterations, against hand computations; the external writer against a loopback OpenAI-compatible server."""

from __future__ import annotations

import json
import math

import pytest

from helpers import FAST, compose, read_scalars, train
from score_lightning.harness.scheduler import DimensionScheduler
from score_lightning.harness.state import HarnessState
from score_lightning import protocol as P
from score_lightning.clients.limiter import Limiter
from score_lightning.retrieval.base import RetrievalError, SearchHit
from score_lightning.rollout.scripted import ProtocolResponder, ScriptedEngine
from score_lightning.step.rubric_source import RubricContext
from score_lightning.methods.drrubric.dr_rubric import DeepResearchRubrics, bootstrap_iteration
from score_lightning.methods.rler.items import Item
from score_lightning.methods.rler.research_prompts import DISTIL_SYSTEM, atomic_items, findings_text, observed_passages


class Corpus:
    def __init__(self):
        self.queries = []

    def search(self, queries, topk):
        self.queries.extend(queries)
        return [[SearchHit("doc.a", "json.dumps turns objects into JSON text", 1.0),
                 SearchHit("doc.b", "indent pretty-prints nested objects", 0.5)][:topk] for _ in queries]


class Down:
    """A retriever whose backend is down: every search raises, as a remote one does after its retries."""

    def __init__(self):
        self.calls = 0

    def search(self, queries, topk):
        self.calls += 1
        raise RetrievalError("search backend unavailable")


def _ctx(tokenizer, step=0, engine=None, retriever=None) -> RubricContext:
    state = HarnessState()
    return RubricContext(engine or ScriptedEngine(tokenizer, ProtocolResponder()), tokenizer, retriever or Corpus(),
                         state, DimensionScheduler(list(state.dimension_pool)), 1024, 0.8, step)


def test_atomic_items_split_merge_and_keep_the_heaviest_by_hand():
    items = [Item("Explains X with a source; Gives an example; ok", 0.6),  # 'ok' is under two words: stays out
             Item("Cites two documents", 0.3), Item("States a claim uncited", 0.2, True),
             Item("cites  two documents.", 0.1), Item("Cites two documents", 0.5, True)]
    got = atomic_items(items, max_items=4)
    # 0.6 / 2 each for the two checks; 0.3 + 0.1 merged at the first's place; the negative twin stays apart
    assert [(i.text, round(i.weight, 6), i.negative) for i in got] == [
        ("Explains X with a source", 0.3, False), ("Gives an example", 0.3, False),
        ("Cites two documents", 0.4, False), ("Cites two documents", 0.5, True)]
    # max_items=2: the two heaviest (0.5 and 0.4), in their original order
    assert [(i.text, i.negative) for i in atomic_items(items, 2)] == [("Cites two documents", False),
                                                                      ("Cites two documents", True)]
    assert atomic_items([Item("one check only", 1.0)], 3) == [Item("one check only", 1.0)]


@pytest.mark.parametrize("step,expected", [(0, 1), (39, 1), (40, 2), (79, 2), (80, 3), (500, 3)])
def test_bootstrap_iteration_of_each_step(step, expected):
    assert bootstrap_iteration(step, 3, 40) == expected
    assert bootstrap_iteration(step, 1, 0) == 1


def test_findings_and_observed_passages():
    text = ("<search>q</search>\n<observation>[doc.a] first passage text\n[doc.b] second</observation>\n"
            "<search>r</search>\n<observation>[doc.a] again\n[doc.c] third one</observation>"
            "<findings> facts  [doc.a]; structure </findings>")
    assert findings_text(text) == "facts [doc.a]; structure"
    assert findings_text("<findings>unclosed") == ""
    assert observed_passages(text, 2, 8) == "[doc.a] first pa\n[doc.b] second"  # first sighting, 2 at most, 8 chars


def test_research_distil_and_rewrite_in_each_iteration(tokenizer):
    seen = []
    engine = ScriptedEngine(tokenizer, lambda req: seen.append(req) or ProtocolResponder()(req))
    src = DeepResearchRubrics(search_turns=2, num_items=4, max_items=3, iterations=3, iteration_steps=2)
    ctx = _ctx(tokenizer, 0, engine)
    step = src.step_rubrics(ctx, ["how does json.dumps work?"], ["q1"], [[]])
    assert ctx.retriever.queries == ["how does json.dumps work"]  # Stage I searched with the writer's own query
    distil = [r for r in seen if r.role == "distil"][0]
    assert "[doc.a] json.dumps turns objects into JSON text" in distil.prompt  # the research's passages ...
    assert "json.dumps work is documented [doc.a]" in distil.prompt  # ... and its notes reach Stage II
    # the scripted items (0.4 "A; B", 0.3 "Cites...", 0.2 flaw, 0.1 "cites...") -> A 0.2, B 0.2, Cites 0.4, flaw 0.2;
    # max_items=3 keeps Cites and the first two of the 0.2 ties (A, B), in order
    entry = src.buffer["q1"]
    assert [(i.text, round(i.weight, 6)) for i in entry.items] == [
        ("Explains how does json.dumps work with a cited document", 0.2), ("Gives a concrete example", 0.2),
        ("Cites at least two retrieved documents", 0.4)]
    assert step.per_query[0].weights == pytest.approx((0.25, 0.25, 0.5)) and step.fallback == [False]
    assert step.stats["rubric/iteration"] == 1.0 and step.stats["rubric/research_searches"] == 1.0
    assert step.stats["rubric/items_added"] == 3.0 and step.stats["rubric/write_fail_rate"] == 0.0
    assert step.samples == [] and not src.trains_evaluator  # the paper trains no rubric tokens
    # step 1 (same iteration): nothing rewritten; step 2 (iteration 2): rewritten by the current writer
    n = len(seen)
    again = src.step_rubrics(_ctx(tokenizer, 1, engine), ["how does json.dumps work?"], ["q1"], [[]])
    assert len(seen) == n and again.stats["rubric/rewritten"] == 0.0
    third = src.step_rubrics(_ctx(tokenizer, 2, engine), ["how does json.dumps work?"], ["q1"], [[]])
    assert third.stats["rubric/rewritten"] == 1.0 and src.buffer["q1"].iteration == 2
    copy = DeepResearchRubrics(iterations=3, iteration_steps=2)
    copy.load_state_dict(json.loads(json.dumps(src.state_dict())))
    assert copy.buffer["q1"] == src.buffer["q1"]


def test_a_failed_write_keeps_the_previous_items_and_is_counted(tokenizer):
    src = DeepResearchRubrics(iterations=2, iteration_steps=1)
    src.step_rubrics(_ctx(tokenizer, 0), ["how does json.dumps work?"], ["q1"], [[]])
    before = list(src.buffer["q1"].items)

    def broken(req):
        return "<rubric_items></rubric_items>" if req.role == "distil" else ProtocolResponder()(req)

    out = src.step_rubrics(_ctx(tokenizer, 1, ScriptedEngine(tokenizer, broken)), ["how does json.dumps work?", "new"],
                           ["q1", "q2"], [[], []])
    assert src.buffer["q1"].items == before and src.buffer["q1"].iteration == 1  # retried on the next visit
    assert out.stats["rubric/write_fail_rate"] == 1.0 and out.fallback == [False, True] and not out.valid


def test_train_writer_gives_the_distillation_tokens_to_reinforce(tokenizer):
    src = DeepResearchRubrics(train_writer=True)
    out = src.step_rubrics(_ctx(tokenizer), ["how does json.dumps work?"], ["q1"], [[]])
    (sample, owners), = out.samples
    assert owners == [0] and sample.valid and src.trains_evaluator
    assert "</rubric_items>" in tokenizer.decode([t for t, m in zip(sample.response_ids, sample.train_mask) if m])


def test_external_writer_searches_then_distils_over_loopback(tokenizer):
    from openai_stub import OpenAIStub, Reply

    replies = ["<search>json dumps indent</search>", "<findings>indent pretty-prints [doc.b]</findings>",
               '<rubric_items><item weight="1">Mentions indent; Cites doc.b</item></rubric_items>']
    with OpenAIStub(content="unused") as stub:
        stub.script(*(Reply(content=r) for r in replies))
        src = DeepResearchRubrics(writer="external", external={"base_url": stub.base_url, "model": "m",
                                                               "max_retries": 0})
        ctx = _ctx(tokenizer)
        out = src.step_rubrics(ctx, ["how does json.dumps indent?"], ["q1"], [[]])
        second = stub.requests[1].json["messages"]
        distil = stub.requests[2].json["messages"][-1]["content"]
    assert ctx.retriever.queries == ["json dumps indent"]
    assert second[-1]["role"] == "user" and second[-1]["content"].startswith("<observation>[doc.a]")
    assert "indent pretty-prints [doc.b]" in distil and "[doc.b] indent pretty-prints nested objects" in distil
    assert [(i.text, i.weight) for i in src.buffer["q1"].items] == [("Mentions indent", 0.5), ("Cites doc.b", 0.5)]
    assert out.stats["rubric/research_fail_rate"] == 0.0 and out.stats["rubric/research_searches"] == 1.0


def test_external_writer_failure_is_counted_not_scored(tokenizer):
    from openai_stub import OpenAIStub, Reply

    with OpenAIStub(content="unused") as stub:
        stub.script(Reply(status=500), Reply(status=500))
        src = DeepResearchRubrics(writer="external", external={"base_url": stub.base_url, "model": "m",
                                                               "max_retries": 0})
        out = src.step_rubrics(_ctx(tokenizer), ["q?"], ["q1"], [[]])
    assert out.stats["rubric/research_fail_rate"] == 1.0 and out.stats["rubric/write_fail_rate"] == 1.0
    assert out.fallback == [True] and "q1" not in src.buffer


def _external(stub, **extra) -> DeepResearchRubrics:
    return DeepResearchRubrics(writer="external", external={"base_url": stub.base_url, "model": "m", "max_retries": 0},
                               **extra)


ITEMS = '<rubric_items><item weight="1">Mentions indent</item></rubric_items>'


def test_external_writer_counts_a_failed_search_and_the_step_goes_on(tokenizer):
    """A RetrievalError in the external writer's research is a "retrieval failed" observation, counted; the notes
    and the items are still written (as the policy writer's agent loop degrades)."""
    from openai_stub import OpenAIStub, Reply

    with OpenAIStub(content="unused") as stub:
        stub.script(*(Reply(content=r) for r in ("<search>json dumps indent</search>",
                                                 "<findings>indent pretty-prints</findings>", ITEMS)))
        out = (src := _external(stub)).step_rubrics(_ctx(tokenizer, retriever=(down := Down())), ["q?"], ["q1"], [[]])
        second = stub.requests[1].json["messages"]
    assert down.calls == 1 and P.RETRIEVAL_FAILED_OBSERVATION in second[-1]["content"]
    assert out.stats["rubric/research_retrieval_errors"] == 1.0 and out.stats["rubric/research_fail_rate"] == 0.0
    assert [i.text for i in src.buffer["q1"].items] == ["Mentions indent"] and out.fallback == [False]


def test_policy_writer_counts_its_failed_searches_too(tokenizer):
    out = DeepResearchRubrics().step_rubrics(_ctx(tokenizer, retriever=Down()), ["how does json.dumps work?"], ["q1"],
                                             [[]])
    assert out.stats["rubric/research_retrieval_errors"] == 1.0 and out.stats["rubric/research_searches"] == 1.0


def test_external_writer_shows_stage_two_at_most_max_passages(tokenizer):
    from openai_stub import OpenAIStub, Reply

    with OpenAIStub(content="unused") as stub:
        stub.script(*(Reply(content=r) for r in ("<search>json dumps</search>", "<findings>notes</findings>", ITEMS)))
        _external(stub, max_passages=1).step_rubrics(_ctx(tokenizer), ["q?"], ["q1"], [[]])
        distil = stub.requests[2].json["messages"][-1]["content"]
    # the search returned doc.a and doc.b; Stage II sees the first one only, as from the policy writer
    assert "[doc.a] json.dumps turns objects into JSON text" in distil and "[doc.b]" not in distil


def test_external_writer_calls_run_concurrently_under_the_limiter(tokenizer):
    """Four queries, three calls each (search, notes, items), 0.3 s a reply: the loopback server sees several calls
    in flight at once, never more than the limiter's three."""
    from openai_stub import OpenAIStub

    def reply(body) -> str:
        messages = body["messages"]
        if messages[0]["content"] == DISTIL_SYSTEM:
            return ITEMS
        return "<search>json dumps</search>" if len(messages) == 2 else "<findings>notes [doc.a]</findings>"

    with OpenAIStub(content=reply, delay_s=0.3) as stub:
        src = DeepResearchRubrics(writer="external", external={"base_url": stub.base_url, "model": "m",
                                                               "max_retries": 0, "limiter": Limiter(3)})
        ids = [f"q{i}" for i in range(4)]
        out = src.step_rubrics(_ctx(tokenizer), [f"question {i}?" for i in range(4)], ids, [[]] * 4)
    assert 1 < stub.in_flight_max <= 3 and len(stub.requests) == 12
    assert sorted(src.buffer) == ids and out.stats["rubric/write_fail_rate"] == 0.0
    assert out.stats["rubric/research_searches"] == 1.0 and out.fallback == [False] * 4


def test_bad_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="rubric.iterations=3 needs rubric.iteration_steps"):
        DeepResearchRubrics(iterations=3)
    with pytest.raises(ValueError, match="rubric.writer='judge'"):
        DeepResearchRubrics(writer="judge")
    from score_lightning.launch.config_validation import validate_config

    with pytest.raises(Exception, match="rubric=drrubric"):
        validate_config(compose(["experiment=drrubric_tiny", "rollout.mode=async"]))


def test_drrubric_tiny_runs_two_steps(tmp_path, tiny_ckpt):
    out = tmp_path / "dr"
    fast = [a.replace("experiment=tiny_score", "experiment=drrubric_tiny") for a in FAST]
    train([*fast, "rollout=scripted", "solver.num_rollouts=3", "trainer.max_steps=2", "solver.max_response_tokens=200",
           "evaluator.max_response_tokens=500", "rubric.iteration_steps=1", "rubric.iterations=2",
           f"paths.output_dir={out}"])
    scalars = read_scalars(out / "tensorboard")
    assert [v for _, v in scalars["rubric/iteration"]] == [1.0, 2.0]
    assert [v for _, v in scalars["rubric/rewritten"]] == [1.0, 1.0]  # FAST: one query per step, rewritten each
    assert [v for _, v in scalars["rubric/write_fail_rate"]] == [0.0, 0.0]
    assert all(v > 0 and math.isfinite(v) for _, v in scalars["solver/reward_mean"])
