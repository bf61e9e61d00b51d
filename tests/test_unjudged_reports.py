"""A judgement is a score or a counted failure, nothing in between (issue 69).

Real trainers with the scripted engine, an OpenAI-compatible judge on loopback (``tests/openai_stub.py``):

* a judge reply that closes its block but breaks a rule (a dimension unscored, a value of 80, the ``<verification>``
  the harness requires missing) is asked again with the reason, then dropped and counted as ``invalid``;
* with half the judgements failing, RLER's buffer (its pruning spreads, its best / worst contrast), the
  discriminative reward and the logged reward statistics equal hand computations over the judged reports only;
* a preference pair whose evaluation was cut is left out and counted, whichever report came first;
* the pairs a step draws follow the run's ``seed``.
"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from helpers import FAST, compose
from openai_stub import OpenAIStub, Reply
from judge_fixtures import B, K, ROW, Solver, _grpo, _train, evaluation
from score_lightning.rollout.scripted import ScriptedEngine, ScriptRequest

def _cfg(tmp_path, stub: OpenAIStub, *overrides: str):
    base = [o for o in FAST if not o.startswith(("experiment=", "solver.num_rollouts", "data.batch_size",
                                                  "optim.mini_batch_size", "optim.micro_batch_size"))]
    return compose(["experiment=grpo_judge_tiny", *base, f"paths.output_dir={tmp_path}", f"solver.num_rollouts={K}",
                    f"data.batch_size={B}", f"optim.mini_batch_size={B}", "optim.micro_batch_size=4",
                    "optim.warmup_steps=0", "solver.max_response_tokens=160", "reward.require_citation=true",
                    f"judge.base_url={stub.base_url}", "judge.model=judge-x", "judge.api_key_env=null",
                    "judge.max_concurrency=2", "judge.timeout_s=5.0", "judge.max_retries=1", *overrides])


# ----------------------------------------------------------------------------- closed but invalid replies
#: per row (query-major): a uniform score, or a malformed reply the judge keeps sending
BROKEN = {0: 9, 1: "missing_dimension", 2: 3, 3: 6, 4: "value_80", 5: 5, 6: "no_verification", 7: 7}
REASONS = {"missing_dimension": "missing score for", "value_80": "score 80 for", "no_verification": "missing <verification>"}


def broken_judge(request: dict):
    prompt = request["messages"][1]["content"]  # re-asks append the rejected reply and the reason after it
    plan = BROKEN[int(ROW.search(prompt).group(1))]
    if plan == "missing_dimension":
        return evaluation(prompt, 8, drop_last=True)
    if plan == "value_80":
        return evaluation(prompt, 80)
    if plan == "no_verification":
        return evaluation(prompt, 8, verification=False)
    return evaluation(prompt, plan)


def test_a_closed_but_invalid_judge_reply_is_asked_again_then_dropped_and_counted(tmp_path, tiny_ckpt, corpus_file):
    with OpenAIStub(content=broken_judge) as stub:
        steps = _train(_cfg(tmp_path, stub, "trainer.max_steps=1", "judge.max_failed_rate=0.5",
                            "harness.initial_state.process_constraints.require_verification=true"), Solver())
        requests = [r.json["messages"] for r in stub.chat_requests]
    rw, m, adv = steps[0]["rewards"], steps[0]["metrics"], steps[0]["solver"].advantages.tolist()
    broken = [r for r, p in BROKEN.items() if isinstance(p, str)]
    for row in broken:  # asked, then asked again with the rule it broke (judge.max_retries=1), then given up
        asked = [msgs for msgs in requests if f"report from row {row} " in msgs[1]["content"]]
        assert len(asked) == 2, row
        assert len(asked[1]) == 4 and REASONS[BROKEN[row]] in asked[1][-1]["content"], asked[1][-1]
        assert "<report_evaluations> block" in asked[1][-1]["content"]  # what the re-ask asks for
    for row in set(BROKEN) - set(broken):
        assert sum(f"report from row {row} " in msgs[1]["content"] for msgs in requests) == 1
    assert rw.judged == [r not in broken for r in range(B * K)]
    assert rw.judge.kinds == {"invalid": 3} and m["judge/failed_rate"] == pytest.approx(3 / 8)
    reasons = sorted(rw.judge.reasons)  # the rule each broke, as the re-ask told the judge
    assert len(reasons) == 3 and rw.judge.reasons[reasons[0]] == 1 and reasons[0] == "report 1: missing <verification>"
    assert reasons[1].startswith("report 1: missing score for '") and re.fullmatch(
        r"report 1: score 80 for '\w+' outside 0\.\.10", reasons[2])
    # none of them is a score: R = 1 + v/10 for the judged reports, advantages over them only
    assert rw.rewards.view(B, K)[0, [0, 2, 3]].tolist() == pytest.approx([1.9, 1.3, 1.6])
    assert [adv[0], adv[2], adv[3]] == pytest.approx(_grpo([1.9, 1.3, 1.6]), abs=1e-5)
    assert [adv[5], adv[7]] == pytest.approx(_grpo([1.5, 1.7]), abs=1e-5)
    assert [adv[r] for r in broken] == [0.0] * 3
    # the logged reward statistics (what the meta-harness reads) pool the judged reports only
    judged_rewards = torch.tensor([1.9, 1.3, 1.6, 1.5, 1.7], dtype=torch.float64)
    assert m["solver/reward_mean"] == pytest.approx(judged_rewards.mean().item(), abs=1e-5)
    assert m["solver/reward_std"] == pytest.approx(judged_rewards.std(unbiased=False).item(), abs=1e-4)
    assert m["solver/reward_score_part"] == pytest.approx(judged_rewards.mean().item() - 1.0, abs=1e-5)


def test_the_judge_error_names_the_rule_an_invalid_reply_broke():
    from score_lightning.clients.chat import ChatOutcome
    from score_lightning.clients.judge import JudgeTally

    tally = JudgeTally(endpoint="http://j/v1/chat/completions (model m)")
    tally.add([ChatOutcome(error="invalid", detail="report 1: missing score for 'depth'"), ChatOutcome(value=1),
               ChatOutcome(error="invalid", detail="report 1: missing score for 'depth'"), ChatOutcome(error="timeout")])
    merged = tally.merge(JudgeTally(requests=1, failed=1, kinds={"invalid": 1},
                                    reasons={"report 1: missing <verification>": 1}))
    assert merged.kinds == {"invalid": 3, "timeout": 1} and merged.failed == 4 and merged.requests == 5
    assert merged.describe() == ("4 of 5 judgements failed at http://j/v1/chat/completions (model m): invalid x3, "
                                 "timeout x1 (invalid: report 1: missing score for 'depth' x2; "
                                 "report 1: missing <verification> x1)")


# ----------------------------------------------------------------------------- RLER and discriminative spreads
ITEMS = ('<rubric_items><item weight="1">Names the module</item><item weight="1">Cites a passage</item>'
         '<item weight="1">Gives an example</item><item weight="1">Ends with a conclusion</item></rubric_items>')
#: per row: the judge's value for items i1..i4, or a failure. Among each query's judged reports items 2 and 4 never
#: vary (RLER prunes them); the failed rows' zeros, read as scores, would make them vary.
HALF = {0: (9, 5, 1, 7), 1: "500", 2: (3, 5, 8, 7), 3: "garbage",
        4: "500", 5: (2, 6, 8, 4), 6: (6, 6, 5, 4), 7: "garbage"}
ITEM_TEXTS = re.findall(r">([^<]+)</item>", ITEMS)


def half_failing_judge(request: dict):
    prompt = request["messages"][1]["content"]
    plan = HALF[int(ROW.search(prompt).group(1))]
    if plan == "500":
        return Reply(status=500)
    if plan == "garbage":
        return "The report seems fine overall, I would give it a good mark."
    return evaluation(prompt, plan)


def test_rler_and_the_discriminative_reward_read_judged_reports_only(tmp_path, tiny_ckpt, corpus_file):
    def keep(module):
        return module.last_step, {q: (list(e.items), e.best, e.worst) for q, e in module.rubric_source.buffer.items()}

    with OpenAIStub(content=half_failing_judge) as stub:
        cfg = _cfg(tmp_path, stub, "trainer.max_steps=1", "judge.max_failed_rate=0.5", "rubric=evolving",
                   "evaluator.static_rubric=false", "evaluator.reward=discriminative", "judge.max_retries=0")
        [(step, buffer)] = _train(cfg, Solver(ITEMS), keep)
    rw, ro = step["rewards"], step["rollouts"]
    failed = [r for r, p in HALF.items() if isinstance(p, str)]
    assert rw.judged == [r not in failed for r in range(B * K)]
    assert set(rw.judge.kinds) == {"http_500", "unparseable"} and step["metrics"]["judge/failed_rate"] == 0.5
    # every item weighs 1/4: the rubric part of a judged report is the mean of its four values / 10
    part = {r: sum(v) / 40 for r, v in HALF.items() if not isinstance(v, str)}
    assert rw.rubric_part.tolist() == pytest.approx([part.get(r, 0.0) for r in range(B * K)], abs=1e-6)
    # RLER: each query keeps the items its judged reports spread (std > 0): items 1 and 3 in both queries
    for qi, qid in enumerate(ro.query_ids):
        items, best, worst = buffer[str(qid)]
        rows = [r for r in range(qi * K, (qi + 1) * K) if r not in failed]
        values = torch.tensor([HALF[r] for r in rows], dtype=torch.float32) / 10
        spread = values.std(dim=0, unbiased=False)
        kept = [text for text, s in zip(ITEM_TEXTS, spread.tolist()) if s > 0]
        assert [it.text for it in items] == kept == ["Names the module", "Gives an example"], (qi, spread)
        # the contrast examples: the best and worst *judged* reports by reward (R = 1 + part)
        by_reward = sorted(rows, key=lambda r: part[r])
        assert f"report from row {by_reward[-1]} " in best and f"report from row {by_reward[0]} " in worst
    # the discriminative reward: per query, the population std of its valid, judged reports' rubric parts
    spreads = [torch.tensor([part[r] for r in range(q * K, (q + 1) * K) if r not in failed]).std(unbiased=False).item()
               for q in range(B)]
    assert step["metrics"]["evaluator/discriminative"] == pytest.approx(sum(spreads) / B, abs=1e-6)
    assert step["sample_rewards"] == pytest.approx(spreads, abs=1e-6)  # one item writer per query


def test_solver_reward_and_the_spreads_leave_unjudged_reports_out_by_hand():
    """``evaluator.reward=solver_reward`` and ``discriminative`` per query, on a hand-made step: the unjudged
    reports (rows 1 and 4) are valid, with rubric part 0 and reward 1; they must not count."""
    from types import SimpleNamespace

    from score_lightning.step.evaluator_reward import RewardInputs
    from score_lightning.step.objectives import EVALUATOR_REWARDS

    answers = [SimpleNamespace(valid=True, answer="r")] * 6
    part = torch.tensor([0.2, 0.0, 0.6, 0.5, 0.0, 0.9])
    judged = [True, False, True, True, False, True]

    def per_query(kind: str, judged: list[bool]) -> list:
        return EVALUATOR_REWARDS.get(kind).query_values(RewardInputs(answers, part, part + 1, judged, 3, math.nan))

    assert per_query("solver_reward", judged) == pytest.approx([1.4, 1.7])
    assert per_query("discriminative", judged) == pytest.approx([0.2, 0.2])
    assert per_query("solver_reward", [False] * 3 + [True] * 3)[0] is None


# ----------------------------------------------------------------------------- preference pairs
GOOD, BAD = "CHOSEN report: cited and complete.", "REJECTED report: thin."
DIMS = ("factual_support", "evidence_coverage", "citation_grounding")


def _pairs(path, n: int) -> str:
    rows = [{"id": i, "prompt": f"Question {i}: which standard module parses options?", "chosen": GOOD,
             "rejected": BAD} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _pair_responder(cut_first: str):
    """The evaluator: a rubric ranking the chosen report higher; each pair report scored by its own (pointwise)
    evaluation, chosen 8, rejected 4, except that the evaluation of the pair's ``cut_first`` report stops before
    closing (the question 1 pair only): its report is never scored."""

    def respond(req: ScriptRequest) -> str:
        if req.role == "rubric":
            return "<think>pick</think><dimensions>" + "".join(
                f'<dim name="{d}" weight="{w:.2f}"/>' for d, w in zip(DIMS, (0.5, 0.3, 0.2))) + "</dimensions>"
        if req.role == "solver":
            return "<answer>A report without sources. Conclusion: none.</answer>"
        report = req.context.rsplit("Report 1", 1)[-1]
        side = "CHOSEN" if "CHOSEN" in report else "REJECTED" if "REJECTED" in report else None
        value = 8 if side == "CHOSEN" else 4
        scores = "".join(f'<score dim="{d}" value="{value}" reason="r"/>' for d in DIMS)
        if side == cut_first and "Question 1:" in req.context:
            return f'<report_evaluations><report id="1"><verification>checked</verification><scores>{scores}'
        return (f'<report_evaluations><report id="1"><verification>checked</verification><scores>{scores}</scores>'
                '</report></report_evaluations>')

    return respond


@pytest.mark.parametrize("group_size", [1, 2])
def test_a_pair_with_a_cut_evaluation_is_left_out_whichever_report_came_first(group_size, tmp_path, tiny_ckpt,
                                                                               corpus_file):
    """Pair 0 (chosen first) finishes and ranks right; pair 1 (its reports flipped: rejected first) has one report's
    evaluation cut. Read as 0, the cut report would decide pair 1 by its position (cut chosen: 0, cut rejected: 1);
    left out, the step's agreement is pair 0's alone, 1, and one pair evaluation per rubric is counted incomplete."""
    from score_lightning.launch.training import run

    results = []
    for cut in ("CHOSEN", "REJECTED"):
        out = tmp_path / cut
        f = _pairs(tmp_path / "pairs.jsonl", 2)
        cfg = compose(FAST + [f"paths.output_dir={out}", "trainer.max_steps=1", "optim.warmup_steps=0",
                              "harness.every_n_steps=10", "verifier.enabled=false", "evaluator.max_rubric_tokens=96",
                              "evaluator.max_response_tokens=200", "evaluator.reward=preference",
                              f"evaluator.preferences_path={f}", "evaluator.preference.pairs_per_step=2",
                              f"evaluator.preference.group_size={group_size}"])
        seen = {}

        import lightning as L

        class Keep(L.Callback):
            def on_train_batch_end(self, trainer, module, *args):
                seen["step"], seen["pref"] = module.last_step, module.objectives[-1].reward  # the preference objective

        def install(module, cut=cut):
            module.engine = module.evaluator_engine = ScriptedEngine(module.tokenizer, _pair_responder(cut))

        run(cfg, extra_callbacks=[Keep()], module_hook=install)
        chosen = seen["pref"].choose(0)
        assert [p["id"] for p in chosen] in ([0, 1], [1, 0])
        m = seen["step"]["metrics"]
        results.append((m["evaluator/reward"], m["evaluator/preference_incomplete_rate"]))
    # the pair with the cut evaluation is left out (1 of 2 pairs, or G of 2G pair evaluations), whichever side was cut
    assert results == [(pytest.approx(1.0), pytest.approx(0.5))] * 2


def test_preference_reward_leaves_out_unfinished_pairs_by_hand(tmp_path):
    """The reward path itself: a pair the scorer could not finish (``None``) is no agreement of 0 or 1."""
    from score_lightning.roles.rubric import Rubric
    from score_lightning.methods.preference.reward import PreferenceReward

    pref = PreferenceReward(_pairs(tmp_path / "p.jsonl", 3), pairs_per_step=3, group_size=1)
    rubric = Rubric(DIMS, (0.5, 0.3, 0.2))

    def score_pairs(prompts, reports):  # the first pair finished and ranks right; the others did not finish
        return [[[8, 8, 8], [4, 4, 4]] if r[0] == GOOD else [[4, 4, 4], [8, 8, 8]] for r in reports[:1]] + [None, None]

    assert pref.reward(0, rubric, score_pairs) == 1.0
    assert (pref.scored, pref.incomplete, pref.incomplete_rate) == (3, 2, pytest.approx(2 / 3))
    assert math.isnan(pref.reward(1, rubric, lambda p, r: [None] * len(r)))  # no finished pair: no reward


# ----------------------------------------------------------------------------- the draw follows the run seed
def test_the_preference_draw_follows_the_run_seed(tmp_path):
    from hydra.utils import instantiate

    f = _pairs(tmp_path / "p.jsonl", 12)

    def draws(seed: int) -> list[list[int]]:
        cfg = compose(["experiment=tiny_score", "evaluator.reward=preference", f"evaluator.preferences_path={f}",
                       f"seed={seed}"])
        pref = instantiate(cfg.evaluator.preference, _convert_="all")
        return [[p["id"] for p in pref.choose(step)] for step in range(4)]

    assert draws(3) == draws(3)  # reproducible for one seed (a resumed run draws the same)
    assert draws(3) != draws(4)  # another run seed, other pairs
