"""``evaluator.show_passages``: each report is scored beside the passages it cites (search-assisted verification a
small evaluator can read). The block by hand, its texts from the real corpus and from real observations, the
scoring prompt a step builds, the cold start's demos and key, and the prompt budget."""

from __future__ import annotations

import dataclasses

import pytest

from score_lightning.harness.state import HarnessState
from score_lightning.roles.cited_passages import (
    CITED_HEAD, NOT_RETRIEVED, UNKNOWN, cited_passages, corpus_texts, passages_block, split_observation,
)
from score_lightning.roles.prompts import scoring_messages
from score_lightning.roles.rubric import Rubric

RUBRIC = Rubric(("factual_support", "clarity"), (0.6, 0.4))


def test_an_observation_splits_into_its_passages_by_their_id_heads():
    body = '[json.dumps] "json.dumps"\nSerialize obj to a JSON formatted str.\n[os.path.join] Join one or more paths.'
    assert split_observation(body) == [("json.dumps", '"json.dumps"\nSerialize obj to a JSON formatted str.'),
                                       ("os.path.join", "Join one or more paths.")]
    assert split_observation("No results.") == []


def test_cited_passages_by_hand():
    """First-cited first, each id once, at most ``limit``; text from the map (cut), None when unknown; flagged when
    the report's searches did not return it."""
    report = "A [a.x]. B [b.y] and again [a.x]. C [c.z]. D [d.w]."
    texts = {"a.x": "Alpha text here.", "b.y": "Beta text.", "d.w": "Delta."}
    got = cited_passages(report, ["a.x"], texts, limit=3, cut=lambda t: t[:5])
    assert got == [("a.x", "Alpha", True), ("b.y", "Beta ", False), ("c.z", None, False)]
    assert cited_passages(None, ["a.x"], texts, 3) == [] and cited_passages(report, [], texts, 0) == []
    assert passages_block(got) == (f"{CITED_HEAD}\n[a.x] Alpha\n[b.y] {NOT_RETRIEVED} Beta \n"
                                   f"[c.z] {NOT_RETRIEVED} {UNKNOWN}")
    assert passages_block([]) == f"{CITED_HEAD} none"


def test_the_block_sits_under_each_report_of_the_scoring_prompt():
    state = HarnessState()
    cited = [[("json.dumps", "Serialize obj.", True)], []]
    user = scoring_messages("How?", ["Report one [json.dumps].", "Report two."], RUBRIC, state,
                            [["json.dumps"], []], cited=cited)[1]["content"]
    one = user.index("[Report 1]")
    two = user.index("[Report 2]")
    assert one < user.index("Report one [json.dumps].\nCited passages:\n[json.dumps] Serialize obj.") < two
    assert user.rstrip().endswith("Report two.\nCited passages: none")
    assert CITED_HEAD not in scoring_messages("How?", ["r"], RUBRIC, state)[1]["content"]
    with pytest.raises(ValueError, match="one cited-passage list per report"):
        scoring_messages("How?", ["a", "b"], RUBRIC, state, cited=[[]])


def test_report_citations_read_the_corpus_cut_to_passage_tokens_or_the_searches_texts(tokenizer, bm25):
    from score_lightning.rollout.chat import truncate_text
    from score_lightning.step.rollouts import report_citations, rollout_settings

    from helpers import FAST, compose

    cfg = compose(FAST + ["evaluator.show_passages=true", "evaluator.passage_tokens=12",
                          "evaluator.max_cited_passages=2"])
    settings = rollout_settings(cfg.solver, cfg.evaluator)
    doc = next(d for d in bm25.docs if d.id == "json.dumps")
    report = "Use json.dumps [json.dumps] or [os.path.join], and [no.such.id]."
    got = report_citations(tokenizer, bm25, [report, "(no report)"], [["json.dumps"], []], None, settings)
    assert got == [[("json.dumps", truncate_text(tokenizer, doc.text, 12), True),
                    ("os.path.join", truncate_text(tokenizer, next(d.text for d in bm25.docs if d.id == "os.path.join"),
                                                   12), False)], []]
    assert len(tokenizer(got[0][0][1], add_special_tokens=False)["input_ids"]) <= 12 < len(doc.text.split())
    off = dataclasses.replace(settings, show_passages=False)
    assert report_citations(tokenizer, bm25, [report], [["json.dumps"]], None, off) is None

    class Remote:  # a retriever without a local corpus: the texts its searches showed stand in
        def search(self, queries, topk):
            return [[] for _ in queries]

    assert corpus_texts(Remote()) is None
    shown = [{"json.dumps": "Serialize obj to a JSON formatted str."}]
    got = report_citations(tokenizer, Remote(), [report], [["json.dumps"]], shown, settings)
    assert got == [[("json.dumps", "Serialize obj to a JSON formatted str.", True), ("os.path.join", None, False)]]
    with pytest.raises(ValueError, match="no local corpus"):
        report_citations(tokenizer, Remote(), [report], [["json.dumps"]], None, settings)


def test_shown_passages_are_what_the_trajectorys_observations_carried(tokenizer, bm25):
    """A real agent loop (scripted turns, real BM25 searches, the 64-token observation budget): each shown id maps
    to the part of the observation under its head, so a passage the budget cut stays cut."""
    from score_lightning.rollout.agent import AgentConfig, format_observation, run_agent
    from score_lightning.rollout.search_steps import observation_body, shown_passages
    from score_lightning.sft.context import ScriptEngine

    agent = AgentConfig(max_tool_calls=2, max_response_tokens=400, max_observation_tokens=64, topk=2,
                        finish_tag="</answer>")
    turns = ["<search>json dumps serialize</search>", "<answer>It serializes [json.dumps].</answer>"]
    prompt = tokenizer("Q", add_special_tokens=False)["input_ids"]
    traj = run_agent(ScriptEngine(tokenizer, turns), tokenizer, [prompt], bm25, agent)[0]
    hits = bm25.search(["json dumps serialize"], 2)[0]
    ids, _ = format_observation(hits, 64, tokenizer)
    body = observation_body(tokenizer.decode(ids))
    assert traj.retrieved_ids and shown_passages(traj, tokenizer) == {
        d: t for d, t in split_observation(body) if d in traj.retrieved_ids}
    first = traj.retrieved_ids[0]
    assert shown_passages(traj, tokenizer)[first] in body


def test_a_step_scores_each_report_beside_its_cited_passages(tokenizer, bm25):
    """``scoring_rollouts`` under ``evaluator.show_passages``: the prompt the evaluator read holds the passage of
    the grounded citation and marks the one its searches never returned."""
    from score_lightning.sft.context import ScriptEngine
    from score_lightning.step.rollouts import rollout_settings, scoring_rollouts

    from helpers import FAST, compose

    cfg = compose(FAST + ["evaluator.show_passages=true", "evaluator.scoring=joint", "evaluator.max_tool_calls=0"])
    settings = rollout_settings(cfg.solver, cfg.evaluator)
    reports = [["json.dumps writes JSON [json.dumps].", "It joins paths [os.path.join]."]]
    evaluation = ('<report_evaluations><report id="1"><scores><score dim="factual_support" value="8"/>'
                  '<score dim="clarity" value="7"/></scores></report></report_evaluations>')
    engine = ScriptEngine(tokenizer, [evaluation])
    traj = scoring_rollouts(engine, tokenizer, bm25, ["How do I write JSON?"], reports, [RUBRIC], HarnessState(),
                            settings, [[["json.dumps"], ["json.loads"]]])[0]
    prompt = tokenizer.decode(traj.prompt_ids)
    dumps = next(d.text for d in bm25.docs if d.id == "json.dumps").split()[0]
    assert prompt.count(CITED_HEAD) == 2
    assert f"[json.dumps] {dumps}" in prompt and f"[os.path.join] {NOT_RETRIEVED}" in prompt


def test_cold_start_demos_show_the_block_and_only_the_switch_changes_the_key(tokenizer, bm25, tmp_path):
    import random

    from score_lightning.sft.cache import sft_key_inputs
    from score_lightning.sft.context import DemoContext
    from score_lightning.sft.demo_types import demo_budgets
    from score_lightning.sft.scoring_demos import scoring_group

    from helpers import compose

    base = compose(["experiment=tiny_score"])
    on = compose(["experiment=tiny_score", "evaluator.show_passages=true"])
    (tmp_path / "config.json").write_text("{}")
    off_key, on_key = sft_key_inputs(base, str(tmp_path)), sft_key_inputs(on, str(tmp_path))
    assert "passages" not in off_key["budgets"] and on_key["budgets"]["passages"] == (48, 4)
    assert {k for k in off_key if off_key[k] != on_key[k]} == {"budgets"}

    queries = ["How do I write JSON with json.dumps?", "How do I join paths with os.path.join?"]
    budgets = demo_budgets(on.solver, on.evaluator)
    ctx = DemoContext.create(tokenizer, bm25, queries, budgets, HarnessState())
    prompts = [tokenizer.decode(d.prompt_ids) for s in range(6)
               for d in scoring_group(ctx, random.Random(s), queries[s % 2], 1)]
    assert prompts and all(CITED_HEAD in p for p in prompts)
    assert any(f"{CITED_HEAD}\n[" in p for p in prompts)  # some report cites a passage, shown with its text
    class Remote:  # no local corpus: the demos cannot show a passage's text, and say so
        def search(self, queries, topk):
            return bm25.search(queries, topk)

    with pytest.raises(ValueError, match="local corpus"):
        scoring_group(DemoContext.create(tokenizer, Remote(), queries, budgets, HarnessState()), random.Random(0),
                      queries[0], 1)
    plain = DemoContext.create(tokenizer, bm25, queries, demo_budgets(base.solver, base.evaluator), HarnessState())
    assert not any(CITED_HEAD in tokenizer.decode(d.prompt_ids) for d in scoring_group(plain, random.Random(0),
                                                                                       queries[0], 1))


def test_the_budget_check_counts_the_passages(tokenizer):
    from score_lightning.launch.budgets import measure_scoring

    from helpers import compose

    off = measure_scoring(compose(["experiment=tiny_score"]), tokenizer).prompt_tokens
    on = measure_scoring(compose(["experiment=tiny_score", "evaluator.show_passages=true",
                                  "evaluator.max_cited_passages=3", "evaluator.passage_tokens=40"]), tokenizer)
    assert on.prompt_tokens - off >= 3 * 40
