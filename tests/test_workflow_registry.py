"""The solver-workflow, scripted-role and cold-start-demo extension points: a switch selects a registered plug-in,
an unknown one is refused with the names that exist, and a plug-in registered here (not shipped) is what the step,
the scripted engine and the cold start use, with no core change."""

from __future__ import annotations

import pytest

from helpers import compose
from score_lightning.rollout.scripted import ProtocolResponder, ScriptedEngine, prompt_role
from score_lightning.rollout.scripted_roles import SCRIPTED_ROLES, ScriptedRole
from score_lightning.rollout.workflows import SOLVER_WORKFLOWS, SolverWorkflow, messages_rollouts
from score_lightning.sft.demo_registry import DEMO_SOURCES, DemoSource, ExtraKind
from score_lightning.sft.demo_types import Demo
from score_lightning.step.rollouts import rollout_settings, solver_rollouts

ECHO_SYSTEM = "You are the echo agent of this test. Repeat the question, then answer it."


def _register(monkeypatch, registry, name, entry):
    """Register ``entry`` for this test only (the registry keeps no test's entries)."""
    monkeypatch.setitem(registry._entries, name, entry)


def test_an_unknown_solver_agent_is_refused_with_the_registered_names():
    from score_lightning.evaluation.generate import solver_workflow
    from score_lightning.evaluation.generate_config import GenerateConfig

    assert {"react", "mams", "rubricem"} <= set(SOLVER_WORKFLOWS.names())  # the core's and the shipped plug-ins'
    with pytest.raises(KeyError, match=r"solver.agent='nope': no such entry \(registered: mams, react, rubricem"):
        cfg = compose(["experiment=tiny_score", "solver.agent=nope"])
        rollout_settings(cfg.solver, cfg.evaluator)
    with pytest.raises(ValueError, match=r"solver.agent='nope'.*registered: mams, react, rubricem"):
        solver_workflow(GenerateConfig(model="m", queries="q", out="o", agent="nope"))


def test_a_workflow_registered_here_rolls_out_the_step_and_sets_the_trajectory_cap(monkeypatch, tokenizer, bm25):
    from score_lightning.step.solver_update import trajectory_cap

    seen = {}

    def echo_rollouts(engine, tokenizer, retriever, queries, rubrics, state, settings, options, guidance, metas):
        seen.update(options=options, metas=list(metas), guidance=guidance)
        messages = [[{"role": "system", "content": ECHO_SYSTEM}, {"role": "user", "content": f"Question: {q}\n\n"}]
                    for q in queries]
        return messages_rollouts(engine, tokenizer, retriever, messages, settings, metas)

    echo = SolverWorkflow(echo_rollouts, options_from_solver=lambda solver: {"searches": int(solver.max_tool_calls)},
                          trajectory_tokens=lambda solver: 7 * int(solver.max_tool_calls))
    _register(monkeypatch, SOLVER_WORKFLOWS, "echo", echo)
    cfg = compose(["experiment=tiny_score", "solver.agent=echo", "solver.num_rollouts=2", "solver.max_tool_calls=3"])
    settings = rollout_settings(cfg.solver, cfg.evaluator)
    assert settings.options == {"searches": 3} and trajectory_cap(cfg.solver) == 21

    engine = ScriptedEngine(tokenizer, lambda req: f"<answer>echo {req.index} [{req.query}]</answer>")
    trajs = solver_rollouts(engine, tokenizer, bm25, ["What is json?", "What is re?"], [None, None], None, settings,
                            guidance=["g0", "g1"])
    assert seen == {"options": {"searches": 3}, "guidance": ["g0", "g1"],
                    "metas": [{"query_index": 0, "k": 0}, {"query_index": 0, "k": 1}, {"query_index": 1, "k": 0},
                              {"query_index": 1, "k": 1}]}
    assert [t.meta for t in trajs] == seen["metas"]  # query-major, K rows per query, as GRPO's groups expect
    assert [r.query for r in engine.requests] == ["What is json?"] * 2 + ["What is re?"] * 2
    assert all(ECHO_SYSTEM in r.prompt for r in engine.requests)
    assert [tokenizer.decode(t.response_ids) for t in trajs][3].startswith("<answer>echo 1 [What is re?]")


def test_a_scripted_role_registered_here_is_recognised_and_answered(monkeypatch, tokenizer):
    assert prompt_role(f"<|im_start|>system\n{ECHO_SYSTEM}<|im_end|>") == "unknown"
    _register(monkeypatch, SCRIPTED_ROLES, "echo", ScriptedRole(ECHO_SYSTEM, lambda req: f"echo: {req.query}"))
    prompt = tokenizer.apply_chat_template([{"role": "system", "content": ECHO_SYSTEM},
                                            {"role": "user", "content": "Question: What is json?\n\n"}],
                                           add_generation_prompt=True, tokenize=True)
    engine = ScriptedEngine(tokenizer, ProtocolResponder())
    from score_lightning.rollout.engine import SamplingParams

    gen = engine.generate([list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)],
                          SamplingParams(max_new_tokens=32))[0]
    assert engine.requests[0].role == "echo" and tokenizer.decode(gen.token_ids).startswith("echo: What is json?")
    assert prompt_role(engine.requests[0].prompt) == "echo"


def test_a_demo_source_registered_here_joins_the_cold_start_when_its_switch_is_on(monkeypatch, tokenizer, bm25):
    from score_lightning.sft.demo_types import demo_budgets
    from score_lightning.sft.demos import build_demos
    from score_lightning.sft.workflow_demos import workflow_demo_spec, workflow_key_inputs, workflow_kinds

    def group(ctx, rng, query, n):
        return [Demo("echo", [1, 2], [3, tokenizer.eos_token_id], [1, 1], meta={"query": query}) for _ in range(n)]

    source = DemoSource(9, {"echo": 3, "echo_per_prompt": 1},
                        lambda cfg, counts, on: {"num_echo": int(counts["echo"]) if on else 0},
                        lambda fields: [ExtraKind("echo", fields["num_echo"], 1, group)] if fields["num_echo"] else [])
    _register(monkeypatch, SOLVER_WORKFLOWS, "echo", SOLVER_WORKFLOWS.get("react"))
    _register(monkeypatch, DEMO_SOURCES["solver.agent"], "echo", source)
    assert workflow_key_inputs(compose(["experiment=tiny_score"])) == {}  # off: the default cold start's key as it was
    cfg = compose(["experiment=tiny_score", "solver.agent=echo"])
    spec = workflow_demo_spec(cfg)
    key = workflow_key_inputs(cfg)["workflow_demos"]
    assert key["num_echo"] == 3 and key["num_mams"] == 0 and key["mams"] is None  # the shipped sources' fields, off
    assert [k.kind for k in workflow_kinds(spec)] == ["echo"]
    demos, stats = build_demos(tokenizer, bm25, ["What is json?"], demo_budgets(cfg.solver, cfg.evaluator), 0, 0, 0,
                               seed=1, extra=workflow_kinds(spec))
    assert [d.kind for d in demos] == ["echo"] * 3 and stats.built["echo"] == 3
