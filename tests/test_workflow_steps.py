"""Solver workflows through the real training step (scripted engine, hand-computed numbers), and the two
presets on the CLI (issue 19).

* ``solver.agent=mams``: one SCORE step of three MaMs trajectories; the rewards, the group advantages,
  the rows trained (one per role call, every role token trained) and the MaMs scalars, by hand.
* ``reward.step=rubric``: one SCORE step of three ReAct trajectories (two, one and one searches) whose
  steps the evaluator judges; the step scores, their group-normalised advantages on exactly the
  search turns' tokens, the agreement reward of the judgements and what the evaluator update gets.
"""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch

from helpers import FAST, compose, read_scalars, train
from score_lightning.retrieval.base import SearchHit
from score_lightning.methods.mams.prompts import parse_state
from score_lightning.rollout.scripted import ScriptedEngine, ScriptRequest
from score_lightning.rollout.scripted_roles import SCRIPTED_ROLES
from score_lightning.rollout.search_steps import search_steps, shown_passages

RUBRIC = ('<dimensions><dim name="factual_support" weight="0.50"/><dim name="evidence_coverage" weight="0.30"/>'
          '<dim name="citation_grounding" weight="0.20"/></dimensions>')
DIMS = ("factual_support", "evidence_coverage", "citation_grounding")
SCORES = {1: (8, 6, 4), 2: (4, 4, 4), 3: (9, 9, 9)}
#: R = a(r) (1 + 0.5 s1 + 0.3 s2 + 0.2 s3); the third report cites nothing: a(r) = 0
REWARDS = [1 + 0.5 * 0.8 + 0.3 * 0.6 + 0.2 * 0.4, 1 + 0.4, 0.0]
JUDGED = {"json dumps": (8, 6), "pickle loads": (2, 9)}  # (relevance, novelty) per search


class Docs:
    """A retriever whose answers are known: a query about pickle finds [pickle.loads], anything else [json.dumps]."""

    def search(self, queries, topk):
        doc = lambda q: "pickle.loads" if q.startswith("pickle") else "json.dumps"  # noqa: E731
        return [[SearchHit(doc(q), f'"{doc(q)}"\nThe {doc(q)} function is documented here.', 1.0)] for q in queries]


def _evaluation(req: ScriptRequest) -> str:
    if req.turn == 0:
        return "<search>verify the cited claims</search>"
    body = "".join(f'<report id="{i}"><verification>checked</verification><gap_analysis>none</gap_analysis><scores>'
                   + "".join(f'<score dim="{d}" value="{v}" reason="r"/>' for d, v in zip(DIMS, SCORES[i]))
                   + "</scores></report>" for i in (1, 2, 3))
    return f"<report_evaluations>{body}</report_evaluations>"


def _react(req: ScriptRequest) -> str:
    """k = 0 searches json then pickle, k = 1 and k = 2 json only; k = 2 does not cite."""
    plan = {0: ["json dumps", "pickle loads"], 1: ["json dumps"], 2: ["json dumps"]}[req.index]
    if req.turn < len(plan):
        return f"<search>{plan[req.turn]}</search>"
    cite = " [json.dumps]" if req.index < 2 else ""
    return f"<answer>The json.dumps function serialises objects{cite}. Conclusion: use json.dumps.</answer>"


def _judge(req: ScriptRequest) -> str:
    search = req.prompt.split("This search: ", 1)[1].split("\n", 1)[0].strip()
    rel, nov = JUDGED[search]
    return f'<step_eval><rubric>name the function</rubric><step_score relevance="{rel}" novelty="{nov}"/></step_eval>'


def script(req: ScriptRequest) -> str:
    if req.role == "rubric":
        return RUBRIC
    if req.role == "scoring":
        return _evaluation(req)
    if req.role == "solver":
        return _react(req)
    if req.role == "step":
        return _judge(req)
    return SCRIPTED_ROLES.get(req.role).respond(req)  # MaMs roles: the library script (report quality by k)


def _one_step(tmp_path, extra: list[str], script_fn=None) -> dict:
    from score_lightning import module as module_py
    from score_lightning.step import solver_update as solver_py
    from score_lightning.launch.training import run

    seen: dict = {"dense": [], "evaluator": []}
    cfg = compose(FAST + [
        f"paths.output_dir={tmp_path}", "trainer.max_steps=1", "solver.num_rollouts=3", "optim.micro_batch_size=3",
        "solver.max_response_tokens=200", "evaluator.max_response_tokens=400", "evaluator.max_rubric_tokens=96",
        "reward.require_citation=true", "verifier.min_search_depth=1", "harness.every_n_steps=10", "optim.lr=1e-4",
        "optim.warmup_steps=0", "evaluator.scoring=joint", *extra])  # the hand numbers score all K jointly

    def install(module):
        module.engine = module.evaluator_engine = ScriptedEngine(module.tokenizer, script_fn or script)
        module.retriever = Docs()
        judge = module.step_stage.judge

        def judged(view):  # reward.step's objective: keep the step's judgement it folds
            bonus = judge(view)
            seen.setdefault("judgement", getattr(module.step_stage, "judgement", None))  # None: reward.step=none
            return bonus

        module.step_stage.judge = judged

    def dense(*a):
        seen["dense"].append(real_dense(*a))
        return seen["dense"][-1]

    def update(model, ref, samples, advantages, *rest):
        seen["evaluator"].append((list(samples), list(advantages)))
        return real_update(model, ref, samples, advantages, *rest)

    real_dense, real_update = solver_py.token_advantages, module_py.evaluator_update
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(solver_py, "token_advantages", dense)
        mp.setattr(module_py, "evaluator_update", update)
        probe = _LastStep()
        run(cfg, extra_callbacks=[probe], module_hook=install)
    return {**probe.last, **seen, "tokenizer": probe.tokenizer, "passages": probe.passages}


class _LastStep(L.Callback):
    """Keeps the module's ``last_step`` and tokenizer."""

    def on_train_batch_end(self, trainer, module, *args):
        self.last, self.tokenizer = module.last_step, module.tokenizer
        self.passages = module._passages(module.last_step["rollouts"])  # what RLER's contrast reads of the step


def _hand_advantages(values: list[float]) -> list[float]:
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return [(v - mean) / (std + 1e-6) for v in values]


def test_mams_step_by_hand(tmp_path, tiny_ckpt):
    step = _one_step(tmp_path, ["solver.agent=mams"])
    trajs = step["rollouts"].solver
    assert step["rewards"].rewards.tolist() == pytest.approx(REWARDS, abs=1e-6)
    assert step["solver"].advantages.tolist() == pytest.approx(_hand_advantages(REWARDS), abs=1e-5)
    # one row per role call (search, state per chunk, report), every role token trained once
    assert [s.role for s in trajs[0].segments] == ["search", "state", "report"]
    assert len(step["solver"].rows) == sum(len(t.segments) for t in trajs) == 9
    assert step["solver"].sums["tokens"] == sum(len(t.response_ids) for t in trajs)
    assert step["dense"] == []  # no step rewards: one advantage per row, the trajectory's
    m = step["metrics"]
    assert m["rollout/mams_turns_mean"] == 1.0 and m["rollout/context_tokens_max"] == max(
        len(s.prompt_ids) for t in trajs for s in t.segments)
    tok = step["tokenizer"]
    memory = [parse_state(tok.decode(t.segments[1].response_ids)).memory for t in trajs]
    assert all("[json.dumps]" in x for x in memory)  # the fact the report role cites came through the memory
    lengths = [len(tok(x, add_special_tokens=False)["input_ids"]) for x in memory]
    assert m["rollout/memory_tokens_mean"] == pytest.approx(sum(lengths) / 3)
    # what RLER's contrast (the module's) and DR Tulu's citation term read of each report's sources: the passage its
    # search role read
    for t, contrast in zip(trajs, step["passages"][0]):
        shown = shown_passages(t, tok)
        assert list(shown) == ["json.dumps"] and shown["json.dumps"] and shown["json.dumps"] in t.step_passages[0]
        assert contrast == shown
    assert "solver/step_reward_mean" not in m


def test_step_rewards_by_hand(tmp_path, tiny_ckpt):
    step = _one_step(tmp_path, ["reward.step=rubric", "reward.step_lambda=0.5", "solver.max_tool_calls=2"])
    trajs, tok, st = step["rollouts"].solver, step["tokenizer"], step["judgement"]
    assert step["rewards"].rewards.tolist() == pytest.approx(REWARDS, abs=1e-6)
    a_traj = _hand_advantages(REWARDS)
    assert step["solver"].advantages.tolist() == pytest.approx(a_traj, abs=1e-5)
    # s = (relevance/10 + novelty/10 + cited)/3: json dumps found [json.dumps], cited by k = 0, 1 only
    s_json, s_json_uncited, s_pickle = (0.8 + 0.6 + 1) / 3, (0.8 + 0.6 + 0) / 3, (0.2 + 0.9 + 0) / 3
    scores = [[s_json, s_pickle], [s_json], [s_json_uncited]]
    assert st.scores == [pytest.approx(r) for r in scores]
    flat = [v for r in scores for v in r]
    hand = _hand_advantages(flat)
    a_step = [hand[:2], hand[2:3], hand[3:]]
    assert st.step_advantages == [pytest.approx(r, abs=1e-5) for r in a_step]
    # A_token = A_traj + 0.5 * A_step on the search turn's tokens, A_traj on every other response token
    dense = step["dense"][-1]
    for i, t in enumerate(trajs):
        base = len(t.prompt_ids) - 1
        expect = [a_traj[i]] * len(t.response_ids)
        for s in search_steps(t, tok):
            expect[s.start:s.end] = [a_traj[i] + 0.5 * a_step[i][s.index]] * (s.end - s.start)
        got = dense[i, base:base + len(t.response_ids)].tolist()
        keep = [j for j, m in enumerate(t.response_mask) if m]
        assert [got[j] for j in keep] == pytest.approx([expect[j] for j in keep], abs=1e-5)
    # the judgements' reward: the correlation of mean step score with R, for every judgement (all valid)
    means = torch.tensor([(s_json + s_pickle) / 2, s_json, s_json_uncited])
    corr = float(torch.corrcoef(torch.stack([means, torch.tensor(REWARDS)]))[0, 1])
    assert st.agreement == [pytest.approx(corr, abs=1e-5)] and st.rewards == pytest.approx([corr] * 4, abs=1e-5)
    assert st.advantages == pytest.approx([corr] * 4, abs=1e-5)  # b_0 = 0
    # one evaluator update: the step rubric (x 5/1) and the four judgements (x 5/4), REINFORCE's mean over 5 rows
    (samples, advs), = step["evaluator"]
    assert len(samples) == 5 and samples[1:] == st.samples
    assert advs == pytest.approx([5 * step["evaluator_advantage"]] + [corr * 5 / 4] * 4, abs=1e-5)
    m = step["metrics"]
    assert m["solver/step_reward_mean"] == pytest.approx(sum(flat) / 4, abs=1e-6)
    assert m["solver/step_adv_abs_mean"] == pytest.approx(sum(0.5 * abs(x) for x in hand) / 4, abs=1e-5)
    assert m["evaluator/step_rubric_valid_rate"] == 1.0
    assert m["evaluator/step_baseline"] == pytest.approx(0.3 * corr, abs=1e-6)


def _unfinished_evaluation(req: ScriptRequest) -> str:
    """The joint evaluation stops after report 2: the group's evaluation is incomplete (report 3 never scored)."""
    if req.role != "scoring" or req.turn == 0:
        return script(req)
    full = _evaluation(req)
    return full[:full.index('<report id="3">')] + "</report_evaluations>"


@pytest.mark.parametrize("workflow", [
    ["reward.step=rubric", "solver.max_tool_calls=2"],  # ARCO's step credit
    ["solver.agent=rubricem", "reward.step=stage", "solver.max_response_tokens=300"],  # RubricEM's stage credit
], ids=["arco", "rubricem"])
def test_a_neutral_group_gets_no_step_or_stage_credit(workflow, tmp_path, tiny_ckpt):
    """evaluator.on_incomplete=neutral sets the group's advantage to 0; the step (or stage) judgements still rank
    its trajectories, but none of that credit may reach its tokens: every trained token's advantage is 0."""
    step = _one_step(tmp_path, [*workflow, "reward.step_lambda=0.5", "evaluator.on_incomplete=neutral"],
                     _unfinished_evaluation)
    rw, st = step["rewards"], step["judgement"]
    assert rw.complete == [False] and rw.neutral.tolist() == [True] * 3
    assert any(b.value != 0.0 for row in st.bonus for b in row)  # the judge did find something to credit
    assert step["solver"].advantages.tolist() == [0.0] * 3
    dense = step["dense"][-1]
    for i, t in enumerate(step["rollouts"].solver):
        base = len(t.prompt_ids) - 1
        got = dense[i, base:base + len(t.response_ids)].tolist()
        assert [g for g, m in zip(got, t.response_mask) if m] == [0.0] * sum(t.response_mask)
    assert step["solver"].sums["pg"] == 0.0  # so the policy term is exactly 0; only the KL trains these rows
    if "reward.step=rubric" in workflow:  # and the logged credit is what the update added: none
        assert not math.isfinite(step["metrics"].get("solver/step_adv_abs_mean", math.nan))


@pytest.mark.parametrize("experiment, tags", [
    ("mams_tiny", ("rollout/mams_turns_mean", "rollout/memory_tokens_mean", "rollout/context_tokens_max")),
    ("arco_tiny", ("solver/step_reward_mean", "solver/step_adv_abs_mean", "evaluator/step_rubric_valid_rate")),
])
def test_workflow_presets_run_three_steps(experiment, tags, tmp_path, tiny_ckpt):
    out = tmp_path / experiment
    fast = [o for o in FAST if not o.startswith("experiment=")]
    train([f"experiment={experiment}", *fast, "rollout=scripted", "solver.num_rollouts=3", "trainer.max_steps=3",
           "solver.max_response_tokens=200", "evaluator.max_response_tokens=500", "evaluator.max_rubric_tokens=160",
           f"paths.output_dir={out}"])
    scalars = read_scalars(out / "tensorboard")
    for key in ("solver/reward_mean", "solver/entropy", "evaluator/rubric_valid_rate", *tags):
        values = [v for _, v in scalars[key]]
        assert len(values) == 3 and all(math.isfinite(v) for v in values), (key, values)
