"""The HF engine's stored KV caches are dropped at each stage boundary of a step (generation/generator.py), and that
changes no computation: no row of one stage could have reused another stage's stored prefix."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from score_lightning.harness.state import HarnessState
from score_lightning.methods.arco import judge as step_judge
from score_lightning.methods.mams import prompts as mams_prompts
from score_lightning.roles.prompts import rubric_messages, scoring_messages, solver_messages
from score_lightning.roles.rubric import fallback_rubric
from score_lightning.rollout.chat import encode_chat
from score_lightning.rollout.kv_cache import PrefixStore
from score_lightning.sft.asset import ASSETS
from score_lightning.generation import generator as generation
from score_lightning.generation.generator import Generator, RunAccess
from score_lightning.step import scoring_sources
from score_lightning.step.types import StepRubric

QUERY = "How does the json module encode Python objects?"


def _stage_prompts(tok) -> dict[str, list[list[int]]]:
    """Every role prompt, grouped by the stage that generates it."""
    state = HarnessState()
    rubric = fallback_rubric(state)
    enc = lambda messages: encode_chat(tok, messages)  # noqa: E731
    return {
        "rubric": [enc(rubric_messages([QUERY], state))],
        "solver": [enc(solver_messages(QUERY, rubric, state, 3)),
                   enc(mams_prompts.search_messages(QUERY, "", "", "", 0, 3)),
                   enc(mams_prompts.state_messages(QUERY, "json", "", "", "chunk", 1, 1)),
                   enc(mams_prompts.report_messages(QUERY, "accuracy", "", "", ""))],
        "scoring": [enc(scoring_messages(QUERY, ["A report [json]."] * 2, rubric, state)),
                    enc(scoring_messages(QUERY, ["A report [json]."], rubric, state, [["json"]], pointwise=True)),
                    enc(step_judge.step_messages(QUERY, [], "json", ["json"]))],
    }


@pytest.mark.parametrize("which", ["tiny", "smollm2"])
def test_no_row_of_a_stage_extends_a_stored_row_of_the_stage_before(which, tokenizer):
    """The stores' minimum reuse is 16 tokens; across a boundary (rubric -> solver -> scoring) the prompts part
    within the system prompt's first words under the tiny tokenizer and SmolLM2's."""
    from score_lightning.policy.models import load_tokenizer

    tok = tokenizer if which == "tiny" else load_tokenizer(ASSETS / "cold_start_smol")
    stages = _stage_prompts(tok)
    floor = PrefixStore(0).min_reuse
    for before, after in (("rubric", "solver"), ("solver", "scoring")):
        longest = max(len(os.path.commonprefix([a, b])) for a in stages[before] for b in stages[after])
        assert 0 < longest < floor, (which, before, after, longest)


class _Engine:
    """Records, per generating stage, whether its stored caches were dropped before it ran."""

    def __init__(self, log: list[str]):
        self.log, self.stored = log, False

    def release_cache(self) -> None:
        self.log.append("release")
        self.stored = False

    def stage(self, name: str) -> None:
        self.log.append(f"{name} (store {'held' if self.stored else 'empty'})")
        self.stored = True


def test_each_generating_stage_starts_with_empty_stores(monkeypatch):
    log: list[str] = []
    engine = _Engine(log)
    rubric = fallback_rubric(HarnessState())

    class Source:
        def step_rubrics(self, ctx, queries, ids, evidence):
            engine.stage("rubric")
            return StepRubric([rubric] * len(queries), [], True, None, fallback=[False] * len(queries))

    def solver(eng, *a, **k):
        eng.stage("solver")
        return [SimpleNamespace(retrieved_ids=["json"]) for _ in range(2)]

    def scoring(eng, *a, **k):
        eng.stage("scoring")
        return []

    answers = [SimpleNamespace(answer="A report [json].")] * 2
    monkeypatch.setattr(generation, "initial_evidence", lambda *a: ([[]], []))
    monkeypatch.setattr(generation, "solver_rollouts", solver)
    monkeypatch.setattr(scoring_sources, "scoring_rollouts", scoring)
    monkeypatch.setattr(generation, "parse_answers", lambda *a: answers)
    monkeypatch.setattr(scoring_sources, "assemble_rewards", lambda *a: "rewards")
    cfg = SimpleNamespace(solver=SimpleNamespace(topk=2, num_rollouts=2), verifier=None,
                          reward=SimpleNamespace(source="evaluator", citation_judge=SimpleNamespace(enabled=False)),
                          evaluator=SimpleNamespace(max_prompt_tokens=1024, temperature=1.0, source="policy"))
    state = HarnessState()
    host = Generator(cfg, None, Source(), SimpleNamespace(show_passages=False),
                     RunAccess(lambda: state, lambda: None, lambda: 0, lambda: None))
    host.engine = host.evaluator_engine = engine
    ro = host.rollout([QUERY])
    assert host.score(ro) == "rewards"
    assert [e for e in log if e != "release"] == ["rubric (store empty)", "solver (store empty)",
                                                  "scoring (store empty)"]
    assert log[-1] == "release"  # and nothing is held once rollouts are done
