"""Rewards that measure what the solver did: grounded validity, pointwise scoring, incomplete evaluations.

Every run here is a real SCORE step (real model, retriever, trainer and updates) with a scripted engine, so the
rewards are non-zero and known in advance; the numbers are checked against hand computations.
"""

from __future__ import annotations

import math
import re

import pytest

from helpers import FAST, compose, plain_grpo
from score_lightning.roles.answer import parse_answer
from score_lightning.rollout.scripted import ScriptedEngine, ScriptRequest

RUBRIC = ('<think>pick</think><dimensions><dim name="factual_support" weight="0.50"/>'
          '<dim name="evidence_coverage" weight="0.30"/><dim name="citation_grounding" weight="0.20"/></dimensions>')
DIMS = ("factual_support", "evidence_coverage", "citation_grounding")
OBS_ID = re.compile(r"<observation>\[([^\]\s]+)\] ")
NEVER_RETRIEVED = "json.never_retrieved_helper"


def _report(rid: int, values, verification: bool = True) -> str:
    ver = "<verification>checked the cited passage</verification>" if verification else ""
    scores = "".join(f'<score dim="{d}" value="{v}" reason="r"/>' for d, v in zip(DIMS, values))
    return f'<report id="{rid}">{ver}<scores>{scores}</scores></report>'


def _solver(req: ScriptRequest, bodies: dict[int, str]) -> str:
    if req.turn == 0:
        return "<think>look it up</think><search>" + " ".join(req.query.split()[:3]) + "</search>"
    cite = OBS_ID.search(req.context).group(1)
    return "<answer>" + bodies[req.index].format(cite=cite) + "</answer>"


class Recorder:
    """Keeps each step's results (the module's ``last_step``)."""

    def __init__(self):
        import lightning as L

        outer = self

        class _CB(L.Callback):
            def on_train_batch_end(self, trainer, module, *args):
                outer.steps.append(module.last_step)

        self.steps: list[dict] = []
        self.callback = _CB()


class BatchRecordingEngine(ScriptedEngine):
    """The scripted engine, remembering which roles each ``generate`` call served (one batch per call)."""

    def __init__(self, tok, respond):
        super().__init__(tok, respond)
        self.batches: list[list[tuple[str, int]]] = []

    def generate(self, prompts, params):
        n = len(self.requests)
        out = super().generate(prompts, params)
        self.batches.append([(r.role, r.turn) for r in self.requests[n:]])
        return out


def _run(tmp_path, overrides: list[str], respond) -> tuple[Recorder, BatchRecordingEngine]:
    from score_lightning.launch.training import run

    cfg = compose(FAST + [f"paths.output_dir={tmp_path}", "trainer.max_steps=1", "optim.warmup_steps=0",
                          "harness.every_n_steps=10", "verifier.min_search_depth=1", "evaluator.max_tool_calls=1",
                          "solver.max_response_tokens=160", "evaluator.max_response_tokens=400",
                          "evaluator.max_rubric_tokens=96", "reward.require_citation=true", *overrides])
    rec = Recorder()
    holder: dict = {}

    def install(module):
        holder["engine"] = module.engine = module.evaluator_engine = BatchRecordingEngine(module.tokenizer, respond)

    run(cfg, extra_callbacks=[rec.callback], module_hook=install)
    return rec, holder["engine"]


# ----------------------------------------------------------------------------- grounded validity
def test_parse_answer_grounding_rule():
    text = "<answer>Claims backed by two documents [json.dumps] and [os.path].\nConclusion: yes.</answer>"
    grounded = parse_answer(text, retrieved=["json.dumps", "os.path"], require_grounded=True)
    assert grounded.valid and grounded.format_valid and grounded.ungrounded == ()
    partly = parse_answer(text, retrieved=["json.dumps"], require_grounded=True)
    assert not partly.valid and partly.format_valid and partly.ungrounded == ("os.path",)
    assert "never retrieved" in partly.reason and "[os.path]" in partly.reason
    observed = parse_answer(text, retrieved=["json.dumps"])  # reward.citations=any: reported, not enforced
    assert observed.valid and observed.ungrounded == ("os.path",)
    uncited = parse_answer("<answer>A report that cites nothing at all, sadly.</answer>", retrieved=["a"],
                           require_grounded=True)
    assert not uncited.valid and uncited.reason == "no citation" and uncited.format_valid


@pytest.mark.parametrize("rule", ["retrieved", "any"])
def test_ungrounded_citation_zeroes_validity_and_is_counted(tmp_path, tiny_ckpt, corpus_file, rule):
    bodies = {0: "A detailed report on the question [{cite}]. Conclusion: alpha beta.",
              1: "A report that also cites a helper it never saw [{cite}] [" + NEVER_RETRIEVED + "]. Conclusion: gamma.",
              2: "A short report, cited twice [{cite}] and [{cite}]. Conclusion: alpha beta."}

    def respond(req: ScriptRequest) -> str:
        if req.role == "rubric":
            return RUBRIC
        if req.role == "solver":
            return _solver(req, bodies)
        if req.turn == 0:
            return "<search>verify the cited claims</search>"
        return "<report_evaluations>" + "".join(_report(k, (6, 6, 6)) for k in (1, 2, 3)) + "</report_evaluations>"

    rec, _ = _run(tmp_path, ["solver.num_rollouts=3", "optim.micro_batch_size=3", f"reward.citations={rule}",
                             "evaluator.scoring=joint"], respond)
    step = rec.steps[0]
    rw, m = step["rewards"], step["metrics"]
    assert [a.cited_ids[-1] for a in rw.answers][1] == NEVER_RETRIEVED
    assert NEVER_RETRIEVED not in step["rollouts"].solver[1].retrieved_ids
    expected = [1.0, 0.0, 1.0] if rule == "retrieved" else [1.0, 1.0, 1.0]
    assert rw.validity.tolist() == expected
    # R = a(r) (1 + 0.6): the ungrounded report earns nothing under `retrieved`
    assert rw.rewards.tolist() == pytest.approx([v * 1.6 for v in expected])
    assert m["solver/ungrounded_citation_rate"] == pytest.approx(1 / 3)  # counted under either rule


# ----------------------------------------------------------------------------- incomplete evaluations
def _grpo(rewards: list[float]) -> list[float]:
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
    return [(r - mean) / (std + 1e-6) for r in rewards]


@pytest.mark.parametrize("rule", ["validity", "drop", "neutral"])
def test_joint_evaluation_that_stops_early(tmp_path, tiny_ckpt, corpus_file, rule):
    """Reports 3-4 of one group are never reached. validity: that group trains on a(r) (report 4 is uncited);
    drop: it leaves the update; neutral: zero advantage. The complete group trains on its full rewards."""
    bodies = {k: "Report number %d on the question [{cite}]. Conclusion: c%d." % (k, k) for k in range(3)}
    bodies[3] = "Report number 3 on the question, with no citation at all. Conclusion: c3."
    first_query: list[str] = []

    def respond(req: ScriptRequest) -> str:
        if req.role == "rubric":
            return RUBRIC
        if req.role == "solver":
            return _solver(req, bodies)
        if req.turn == 0:
            return "<search>verify the cited claims</search>"
        if not first_query:
            first_query.append(req.query)
        values = [(9, 9, 9), (2, 2, 2), (7, 5, 3), (4, 4, 4)]
        if req.query == first_query[0]:  # reports 1 and 2 only, then the turn ends: 3 and 4 never reached
            return "<report_evaluations>" + _report(1, values[0]) + _report(2, values[1]) + "<|im_end|>"
        return "<report_evaluations>" + "".join(_report(k, values[k - 1]) for k in range(1, 5)) + "</report_evaluations>"

    rec, _ = _run(tmp_path, ["solver.num_rollouts=4", "data.batch_size=2", "optim.mini_batch_size=2",
                             "optim.micro_batch_size=4", "evaluator.scoring=joint",
                             "evaluator.max_response_tokens=900", f"evaluator.on_incomplete={rule}"], respond)
    step = rec.steps[0]
    rw, m = step["rewards"], step["metrics"]
    queries = step["rollouts"].queries
    cut = queries.index(first_query[0])
    assert not any(t.truncated for t in step["rollouts"].scoring)
    assert rw.complete == [i != cut for i in range(2)]
    assert rw.validity.view(2, 4)[:, 3].tolist() == [0.0, 0.0] and rw.validity.sum() == 6
    adv = step["solver"].advantages.view(2, 4)
    parts = [0.9, 0.2, 0.5 * 0.7 + 0.3 * 0.5 + 0.2 * 0.3]
    assert adv[1 - cut].tolist() == pytest.approx(_grpo([1 + p for p in parts] + [0.0]), abs=1e-5)
    if rule == "validity":  # R = a(r) for the unjudged group: not 1.9, 1.2, 1.0, 0 (reports 3-4 never judged)
        assert rw.rewards.view(2, 4)[cut].tolist() == [1.0, 1.0, 1.0, 0.0]
        assert adv[cut].tolist() == pytest.approx(_grpo([1.0, 1.0, 1.0, 0.0]), abs=1e-5)
    else:
        assert adv[cut].tolist() == [0.0] * 4
    assert rw.excluded.tolist() == [rule == "drop" and i // 4 == cut for i in range(8)]
    assert rw.neutral.tolist() == [rule == "neutral" and i // 4 == cut for i in range(8)]
    assert m["evaluator/incomplete_rate"] == pytest.approx(0.5)
    assert m["evaluator/unjudged_report_rate"] == pytest.approx(0.5)
    assert m["solver/zero_advantage_group_rate"] == pytest.approx(0.0 if rule == "validity" else 0.5)


def test_dropped_rows_count_nowhere_in_the_token_mean():
    """on_incomplete=drop: an excluded row adds no tokens to the denominator and no gradient; a neutral row
    (advantage 0) still counts its tokens and feels the KL."""
    import torch

    from score_lightning.rollout.trajectory import Trajectory
    from score_lightning.step.solver_update import GRPOSettings, OptimizerHooks, solver_update

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16))

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = model

        def forward(self, input_ids, attention_mask=None, **_):
            return type("Out", (), {"logits": self.net(input_ids)})()

    lm = LM()
    trajs = [Trajectory([1, 2], [3 + k, 4, 5 + k], [1, 1, 1]) for k in range(4)]
    settings = GRPOSettings(4, 1.0, 1, 4, 1, 0.2, 0.2, 0.0, 10.0, 0.0, 1e-6, **plain_grpo())
    grads = []
    hooks = OptimizerHooks(lambda loss: grads.append(torch.autograd.grad(loss, list(lm.parameters()))),
                           lambda: (0.0, True), torch.device("cpu"))
    rewards = torch.tensor([1.0, 0.0, 2.0, 1.0])
    keep = solver_update(lm, None, trajs, rewards, settings, 0, hooks)
    drop = solver_update(lm, None, trajs, rewards, settings, 0, hooks, exclude=torch.tensor([False, False, True, True]))
    assert keep.sums["tokens"] == 12 and drop.sums["tokens"] == 6  # rows 3-4: no tokens counted
    assert drop.advantages.tolist() == pytest.approx([0.7071, -0.7071, 0.0, 0.0], abs=1e-4)  # over rows 1-2 only
    neutral = solver_update(lm, None, trajs, rewards, settings, 0, hooks, neutral=torch.tensor([True] * 4))
    assert neutral.sums["tokens"] == 12 and neutral.advantages.abs().sum() == 0


# ----------------------------------------------------------------------------- pointwise scoring
POINTWISE_BODIES = {0: "A detailed report on the question [{cite}]. Conclusion: alpha beta gamma.",
                    1: "A short report, also cited [{cite}]. Conclusion: alpha beta gamma.",
                    2: "A third report, cited as well [{cite}]. Conclusion: delta."}


def _pointwise_respond(req: ScriptRequest) -> str:
    """Report 1: searched, scored 8/6/4. Report 2: never searched (depth 0). Report 3: searched, but its
    evaluation lacks the <verification> the harness requires (gated); each only in its own evaluation."""
    if req.role == "rubric":
        return RUBRIC
    if req.role == "solver":
        return _solver(req, POINTWISE_BODIES)
    assert "[Report 2]" not in req.prompt and req.prompt.count("[Report 1]") == 1  # one report per prompt
    kind = "detailed" if "A detailed" in req.prompt else "short" if "A short" in req.prompt else "third"
    if req.turn == 0 and kind != "short":
        return "<search>verify the cited claim</search>"
    values = {"detailed": (8, 6, 4), "short": (10, 10, 10), "third": (9, 9, 9)}[kind]
    return "<report_evaluations>" + _report(1, values, verification=kind != "third") + "</report_evaluations>"


def test_pointwise_scoring_by_hand(tmp_path, tiny_ckpt, corpus_file):
    rec, engine = _run(tmp_path, ["solver.num_rollouts=3", "optim.micro_batch_size=3", "evaluator.scoring=pointwise",
                                  "evaluator.show_retrieved=true",
                                  "harness.initial_state.process_constraints.require_verification=true"],
                       _pointwise_respond)
    step = rec.steps[0]
    rw, m, ro = step["rewards"], step["metrics"], step["rollouts"]
    assert len(ro.scoring) == 3  # one evaluation per report
    # the three evaluations were generated as one batch: the first scoring call served all three prompts
    first_scoring = next(b for b in engine.batches if b and b[0][0] == "scoring")
    assert first_scoring == [("scoring", 0)] * 3
    # each prompt shows its report with the ids its own trajectory retrieved
    for traj, ev in zip(ro.solver, ro.scoring):
        prompt = engine.tok.decode(ev.prompt_ids)
        assert "Retrieved by its searches: " + " ".join(f"[{d}]" for d in traj.retrieved_ids) in prompt
    # per report: depth [1, 0, 1] -> report 2 unverified (reward 0); report 3's evaluation is gated (scores 0)
    assert rw.depth.tolist() == [1, 0, 1]
    assert rw.verified.tolist() == [True, False, True]
    assert rw.process_ok.tolist() == [True, True, False]
    assert rw.rewards.tolist() == pytest.approx([1 + 0.5 * 0.8 + 0.3 * 0.6 + 0.2 * 0.4, 0.0, 1.0], abs=1e-6)
    assert rw.eval_valid == [True, True, False] and rw.complete == [True]
    assert m["evaluator/scoring_valid_rate"] == pytest.approx(2 / 3)
    assert m["evaluator/verification_depth_mean"] == pytest.approx(2 / 3)
    assert m["evaluator/verified_rate"] == pytest.approx(2 / 3)
    assert m["evaluator/incomplete_rate"] == 0.0
    assert step["solver"].advantages.abs().sum() > 0


@pytest.mark.parametrize("rule", ["validity", "drop", "neutral"])
def test_pointwise_evaluation_cut_by_its_budget_costs_only_its_report(tmp_path, tiny_ckpt, corpus_file, rule):
    """One of K pointwise evaluations is cut: only its report loses its score part (validity) or leaves
    the update (drop); the K-1 judged reports keep their advantages. neutral zeroes the whole group."""
    def respond(req: ScriptRequest) -> str:
        if req.role != "scoring":
            return _pointwise_respond(req)
        if req.turn == 0:
            return "<search>verify the cited claim</search>"
        if "A short" in req.prompt:  # rambles past the evaluator's token budget
            return "<report_evaluations><report id=\"1\"><verification>" + "checking " * 400
        values = (8, 6, 4) if "A detailed" in req.prompt else (4, 4, 4)
        return "<report_evaluations>" + _report(1, values) + "</report_evaluations>"

    rec, _ = _run(tmp_path, ["solver.num_rollouts=3", "optim.micro_batch_size=3", "evaluator.scoring=pointwise",
                             f"evaluator.on_incomplete={rule}"], respond)
    step = rec.steps[0]
    rw, adv = step["rewards"], step["solver"].advantages
    assert [t.truncated for t in step["rollouts"].scoring] == [False, True, False]
    assert rw.complete == [False] and rw.judged == [True, False, True]
    judged = [1 + 0.5 * 0.8 + 0.3 * 0.6 + 0.2 * 0.4, 1 + 0.4]
    if rule == "validity":
        assert rw.rewards.tolist() == pytest.approx([judged[0], 1.0, judged[1]], abs=1e-6)
        assert adv.tolist() == pytest.approx(_grpo([judged[0], 1.0, judged[1]]), abs=1e-5)
    elif rule == "drop":
        assert adv.tolist() == pytest.approx([0.7071, 0.0, -0.7071], abs=1e-4)
    else:
        assert adv.tolist() == [0.0] * 3
    assert step["metrics"]["evaluator/incomplete_rate"] == 1.0
    assert step["metrics"]["evaluator/unjudged_report_rate"] == pytest.approx(1 / 3)
