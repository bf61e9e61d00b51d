"""One real SCORE step end to end with chosen responses (scripted engine) and hand-computed numbers.

The model, the retriever, the trainer and every update are real; only what the engine samples is
scripted, so rewards are non-zero and known in advance. Checked against hand computations:
rewards (including the process gate and the reward verifier), group advantages, consistency and
the EMA advantage, and the direction in which each update moves the log-probabilities it trains.
"""

from __future__ import annotations

import math
import re

import lightning as L
import pytest
import torch

from helpers import FAST, compose
from score_lightning.step.batching import build_token_batch, policy_logprobs
from score_lightning.data.datamodule import QueryStream
from score_lightning.data.queries import load_queries
from score_lightning.rollout.scripted import ScriptedEngine, ScriptRequest

RUBRIC = ('<think>pick</think><dimensions><dim name="factual_support" weight="0.50"/>'
          '<dim name="evidence_coverage" weight="0.30"/><dim name="citation_grounding" weight="0.20"/></dimensions>')
OBS_ID = re.compile(r"<observation>\[([^\]\s]+)\] ")
DIMS = ("factual_support", "evidence_coverage", "citation_grounding")


def _report(rid: int, values: tuple[int, int, int], verification: bool = True) -> str:
    ver = "<verification>checked the cited passage</verification>" if verification else ""
    scores = "".join(f'<score dim="{d}" value="{v}" reason="r"/>' for d, v in zip(DIMS, values))
    return f'<report id="{rid}">{ver}<scores>{scores}</scores></report>'


class StepScript:
    """Step 1 (queries a, b) and step 2 (queries c, d) of the test, keyed by the query text."""

    def __init__(self, step1: list[str], step2: list[str]):
        self.qa, self.qb = step1
        self.qc, self.qd = step2

    def __call__(self, req: ScriptRequest) -> str:
        if req.role == "rubric":
            return RUBRIC
        if req.role == "solver":
            if req.turn == 0:
                return "<think>look it up</think><search>" + " ".join(req.query.split()[:3]) + "</search>"
            cite = OBS_ID.search(req.context).group(1)
            conclusions = {self.qa: ("alpha beta gamma", "alpha beta gamma"), self.qb: ("red green", "blue yellow"),
                           self.qc: ("one two", "three four"), self.qd: ("five six", "seven eight")}[req.query]
            if req.index == 0:
                return f"<answer>A detailed report on the question [{cite}]. Conclusion: {conclusions[0]}.</answer>"
            if req.index == 1:
                return f"<answer>A short report, also cited [{cite}]. Conclusion: {conclusions[1]}.</answer>"
            return "<answer>A report without any citation at all here. Conclusion: unknown.</answer>"
        # scoring: queries of step 1 search once (verified); those of step 2 never search (depth 0)
        if req.query in (self.qa, self.qb) and req.turn == 0:
            return "<search>verify the cited claims</search>"
        gated = req.query == self.qb  # report 2 lacks <verification> while the harness requires it
        body = _report(1, (8, 6, 4) if req.query != self.qb else (10, 10, 10)) + \
            _report(2, (4, 4, 4) if req.query != self.qb else (5, 5, 5), verification=not gated) + _report(3, (9, 9, 9))
        return f"<report_evaluations>{body}</report_evaluations>"


def scripted_run(cfg, callbacks=(), hook=None) -> None:
    """Train ``cfg`` on :class:`StepScript`'s two batches, both roles on one scripted engine; ``hook(module)`` runs
    after the engines are installed (a pre-step hook, a stub of the test's own)."""
    from score_lightning.launch.training import run

    stream = QueryStream(load_queries(None, split="train"), 2, int(cfg.seed))
    script = StepScript(stream.batch(0)["prompt"], stream.batch(1)["prompt"])

    def install(module):
        module.engine = module.evaluator_engine = ScriptedEngine(module.tokenizer, script)
        if hook is not None:
            hook(module)

    run(cfg, extra_callbacks=list(callbacks), module_hook=install)


class StepRecords(L.Callback):
    """Every step's ``module.last_step`` (rollouts, rewards, metrics ...), in order."""

    def __init__(self):
        self.steps: list[dict] = []

    def on_train_batch_end(self, trainer, module, *args):
        self.steps.append(module.last_step)


def _seq_logprob(model, prompt, response, mask, pad_id, temperature) -> float:
    batch = build_token_batch([prompt], [response], [mask], pad_id)
    with torch.no_grad():
        lp, _ = policy_logprobs(model, batch, temperature)
    return float((lp * batch.loss_mask).sum())


class Probe(L.Callback):
    """Records each step's results and the log-probs the updates should move, before and after."""

    def __init__(self):
        self.steps, self.solver_lp, self.rubric_lp = [], [], []

    def on_train_batch_end(self, trainer, module, *args):
        ls = module.last_step
        self.steps.append(ls)
        sample = ls["rollouts"].rubrics.samples[0][0]
        after = _seq_logprob(module.policy, sample.prompt_ids, sample.response_ids, sample.train_mask,
                             module.tokenizer.pad_token_id, module.cfg.evaluator.temperature)
        self.rubric_lp[-1] = (self.rubric_lp[-1], after)


def _hook(probe: Probe):
    def hook(module, phase):
        ro = module.step_rollouts
        tok, temp = module.tokenizer, float(module.cfg.solver.temperature)
        if phase == "solver" and module.score_step == 0:
            probe.solver_lp.append([_seq_logprob(module.policy, t.prompt_ids, t.response_ids, t.response_mask,
                                                 tok.pad_token_id, temp) for t in ro.solver[:3]])
        if phase == "evaluator":
            if module.score_step == 0:  # after the solver update, before the evaluator's
                probe.solver_lp.append([_seq_logprob(module.policy, t.prompt_ids, t.response_ids, t.response_mask,
                                                     tok.pad_token_id, temp) for t in ro.solver[:3]])
            s = ro.rubrics.samples[0][0]
            probe.rubric_lp.append(_seq_logprob(module.policy, s.prompt_ids, s.response_ids, s.train_mask,
                                                tok.pad_token_id, float(module.cfg.evaluator.temperature)))
    return hook


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory, tiny_ckpt, corpus_file):
    from score_lightning.launch.training import run

    overrides = FAST + [
        f"paths.output_dir={tmp_path_factory.mktemp('step')}", "trainer.max_steps=2", "data.batch_size=2",
        "optim.mini_batch_size=2", "solver.num_rollouts=3", "optim.micro_batch_size=3", "solver.max_response_tokens=160",
        "evaluator.max_response_tokens=400", "evaluator.max_rubric_tokens=96", "solver.max_tool_calls=1",
        "evaluator.max_tool_calls=1", "reward.require_citation=true", "verifier.min_search_depth=1",
        "harness.initial_state.process_constraints.require_verification=true", "harness.every_n_steps=10",
        "optim.lr=1e-4", "optim.warmup_steps=0", "loss.kl_coef=0.05",
        "evaluator.scoring=joint",  # the paper's protocol: one evaluation of all K (pointwise: test_grounded_rewards.py)
    ]
    cfg = compose(overrides)
    stream = QueryStream(load_queries(None, split="train"), 2, int(cfg.seed))
    script = StepScript(stream.batch(0)["prompt"], stream.batch(1)["prompt"])
    probe = Probe()

    def install(module):
        module.engine = module.evaluator_engine = ScriptedEngine(module.tokenizer, script)
        module.pre_step_hook = _hook(probe)

    run(cfg, extra_callbacks=[probe], module_hook=install)
    return probe


def _hand_advantages(rewards: list[float]) -> list[float]:
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))  # unbiased, as verl/TRL
    return [(r - mean) / (std + 1e-6) for r in rewards]


def test_rewards_gates_and_advantages_by_hand(two_steps):
    step1 = two_steps.steps[0]
    rw = step1["rewards"]
    # query a: R = a(r) (1 + 0.5 s1 + 0.3 s2 + 0.2 s3); report 3 has no citation -> a(r) = 0
    qa = [1 + 0.5 * 0.8 + 0.3 * 0.6 + 0.2 * 0.4, 1 + 0.4, 0.0]
    # query b: report 2's evaluation lacks <verification> under require_verification: all its scores -> 0
    qb = [1.0, 1.0, 0.0]
    assert rw.rewards.tolist() == pytest.approx(qa + qb, abs=1e-6)
    assert rw.process_ok.tolist() == [True] * 3 + [False] * 3
    assert rw.verified.all() and rw.tau == 1
    adv = step1["solver"].advantages.tolist()
    assert adv == pytest.approx(_hand_advantages(qa) + _hand_advantages(qb), abs=1e-5)
    m = step1["metrics"]
    assert m["evaluator/process_gate_rate"] == pytest.approx(0.5)
    # query b's report 2 misses the required <verification>: its evaluation, and that one report, are invalid
    assert rw.reports_valid == [True] * 4 + [False, True]
    assert m["evaluator/scoring_valid_rate"] == pytest.approx(0.5)
    assert m["evaluator/report_scores_valid_rate"] == pytest.approx(5 / 6)
    assert m["solver/reward_mean"] == pytest.approx(sum(qa + qb) / 6, abs=1e-6)
    assert m["solver/reward_validity_part"] == pytest.approx(4 / 6)
    # score part: mean over the 4 valid reports of sum_j w_j s_j as used (query b's are gated to 0)
    assert m["solver/reward_score_part"] == pytest.approx((0.66 + 0.4 + 0 + 0) / 4, abs=1e-6)
    assert m["solver/citation_validity"] == pytest.approx(1.0)
    # discrimination, over reports whose scores parsed (not query b's report 2): valid a1 0.66, a2 0.4, b1 0
    # (gated); invalid a3 0.9 (scored 9, 9, 9 but uncited), b3 0 (gated)
    assert m["evaluator/score_valid_reports"] == pytest.approx((0.66 + 0.4 + 0) / 3, abs=1e-6)
    assert m["evaluator/score_invalid_reports"] == pytest.approx((0.9 + 0) / 2, abs=1e-6)
    assert m["evaluator/score_gap_valid_invalid"] == pytest.approx(1.06 / 3 - 0.45, abs=1e-6)

    # step 2: the evaluations never searched, depth 0 < tau_s = 1 -> every reward is 0 (Algorithm 1, line 23)
    rw2 = two_steps.steps[1]["rewards"]
    assert rw2.depth.tolist() == [0] * 6 and not rw2.verified.any()
    assert rw2.rewards.tolist() == [0.0] * 6
    assert two_steps.steps[1]["solver"].advantages.abs().max() == 0


def test_consistency_and_ema_advantage_by_hand(two_steps):
    s1, s2 = two_steps.steps
    # query a: the two valid conclusions are identical (C = 1); query b: disjoint words (C = 0);
    # the invalid third reports do not enter C
    assert s1["metrics"]["evaluator/consistency"] == pytest.approx(0.5)
    assert s1["evaluator_reward"] == pytest.approx(0.5) and s1["evaluator_advantage"] == pytest.approx(0.5)  # b_0 = 0
    assert s1["metrics"]["evaluator/baseline"] == pytest.approx(0.3 * 0.5)  # b_1 = 0.7 * 0 + 0.3 * 0.5
    assert s2["evaluator_reward"] == pytest.approx(0.0)  # all valid conclusions disjoint
    assert s2["evaluator_advantage"] == pytest.approx(0.0 - 0.15)
    assert s2["metrics"]["evaluator/baseline"] == pytest.approx(0.7 * 0.15)


def test_solver_update_moves_logprobs_with_the_advantage(two_steps):
    before, after = two_steps.solver_lp
    adv = two_steps.steps[0]["solver"].advantages[:3].tolist()
    assert adv[0] > 0 and adv[2] < 0
    assert after[0] > before[0], (before, after)  # positive advantage: more likely
    assert after[2] < before[2], (before, after)  # negative advantage: less likely


def test_evaluator_update_moves_rubric_logprob_in_the_sign_of_its_advantage(two_steps):
    (b1, a1), (b2, a2) = two_steps.rubric_lp
    assert a1 > b1, "advantage +0.5: the sampled rubric must become more likely"
    assert a2 < b2, "advantage -0.15: the sampled rubric must become less likely"
