"""``evaluator.scoring_reward=pairwise_recall``: REINFORCE on the scoring tokens, rewarded by a verifiable order.

The reward against hand computations (pure), the fold that keeps each part's mean, the refusals by name, and a real
step (scripted engine, real model, retriever and updates) whose scoring evaluations earn known rewards and enter the
evaluator's one update.
"""

from __future__ import annotations

import json
import re

import pytest

from helpers import FAST, compose
from score_lightning.step.scoring_reward import ScoringJudgement, evaluation_rewards, pair_outcome

RUBRIC = ('<think>pick</think><dimensions><dim name="factual_support" weight="0.50"/>'
          '<dim name="evidence_coverage" weight="0.30"/><dim name="citation_grounding" weight="0.20"/></dimensions>')
DIMS = ("factual_support", "evidence_coverage", "citation_grounding")
OBS_ID = re.compile(r"<observation>\[([^\]\s]+)\] ")


# ----------------------------------------------------------------------------- the reward by hand
def test_pair_outcome_orders_ties_and_reversals():
    assert pair_outcome(0.9, 0.3, 1.0, 0.5) == 1.0
    assert pair_outcome(0.3, 0.9, 1.0, 0.5) == 0.0
    assert pair_outcome(0.3, 0.9, 0.0, 0.5) == 1.0  # both reversed: the order agrees
    assert pair_outcome(0.4, 0.4, 1.0, 0.0) == 0.5


def test_pointwise_rewards_by_hand():
    # q = (1, 0.5, 0), S = (0.9, 0.3, 0.5): (1,2) right, (1,3) right, (2,3) wrong
    assert evaluation_rewards([0.9, 0.3, 0.5], [1.0, 0.5, 0.0], [True] * 3, 3, True) == [1.0, 0.5, 0.5]
    # joint: one evaluation scored all three -> the mean over the three pairs
    assert evaluation_rewards([0.9, 0.3, 0.5], [1.0, 0.5, 0.0], [True] * 3, 3, False) == [pytest.approx(2 / 3)]


def test_unscored_reports_and_equal_quality_leave_no_pair():
    # report 2's scores did not parse: only (1,3) is informative; report 2's evaluation has none
    assert evaluation_rewards([0.9, 0.0, 0.5], [1.0, 0.5, 0.0], [True, False, True], 3, True) == [1.0, None, 1.0]
    # the same quality everywhere (e.g. every report invalid): nothing to order
    assert evaluation_rewards([0.9, 0.1, 0.5], [0.0, 0.0, 0.0], [True] * 3, 3, True) == [None, None, None]
    # two queries, K = 2: pairs never cross queries; a tie earns 1/2
    assert evaluation_rewards([0.2, 0.8, 0.5, 0.5], [0.0, 0.5, 1.0, 0.0], [True] * 4, 2, True) == [1.0, 1.0, 0.5, 0.5]


def test_lengths_that_do_not_match_are_refused():
    with pytest.raises(ValueError, match="differ in length"):
        evaluation_rewards([0.1, 0.2], [0.0], [True, True], 2, True)
    with pytest.raises(ValueError, match="do not split"):
        evaluation_rewards([0.1, 0.2, 0.3], [0.0, 0.1, 0.2], [True] * 3, 2, True)


def test_fold_keeps_each_parts_mean():
    """REINFORCE averages over rows: after the fold, the row mean of A is mean(main) + mean(scoring)."""
    sj = ScoringJudgement(enabled=True, samples=["s1", "s2", "s3"], rewards=[1.0, None, 0.5],
                          advantages=[0.4, -0.1], has_signal=True)
    rows, adv = sj.fold(["r1"], [0.3])
    assert rows == ["r1", "s1", "s3"]
    assert adv == pytest.approx([0.3 * 3, 0.4 * 1.5, -0.1 * 1.5])
    assert sum(adv) / len(adv) == pytest.approx(0.3 + (0.4 - 0.1) / 2)
    # nothing else trains this step: the scoring part alone, unscaled
    assert sj.fold(None, []) == (["s1", "s3"], [0.4, -0.1])
    # off, or no signal on any rank: the update is left as it was
    assert ScoringJudgement().fold(["r1"], [0.3]) == (["r1"], [0.3])
    assert ScoringJudgement(enabled=True).fold(None, []) == (None, [])


@pytest.mark.parametrize("override,needs", [
    (["evaluator.enabled=false"], "evaluator.enabled=true"),
    (["reward.source=rule"], "reward.source=evaluator"),
    (["evaluator.scoring_temperature=0"], "evaluator.scoring_temperature=null or 0.8"),
])
def test_refused_where_no_policy_scoring_trains(override, needs):
    from score_lightning.launch.config_validation import ConfigError, validate_config

    validate_config(compose(["experiment=tiny_score", "evaluator.scoring_reward=pairwise_recall"]))
    with pytest.raises(ConfigError, match=re.escape(needs)):
        validate_config(compose(["experiment=tiny_score", "evaluator.scoring_reward=pairwise_recall", *override]))
    with pytest.raises(ConfigError, match="evaluator.scoring_reward='ranking'"):
        validate_config(compose(["experiment=tiny_score", "evaluator.scoring_reward=ranking"]))


# ----------------------------------------------------------------------------- a real step
def _respond(req):
    """Reports of known item_recall under items {alpha}, {beta} (any cited, retrieved id is evidence): report 1
    states both (q = 1), report 2 only alpha (q = 1/2), report 3 cites nothing (invalid, q = 0). Pointwise scores
    9, 3, 5: the evaluations of reports 2 and 3 order their pair wrong."""
    if req.role == "rubric":
        return RUBRIC
    if req.role == "solver":
        if req.turn == 0:
            return "<think>look it up</think><search>" + " ".join(req.query.split()[:3]) + "</search>"
        cite = OBS_ID.search(req.context).group(1)
        return ["<answer>The passage covers alpha and beta [{c}].\n\nConclusion: alpha and beta.</answer>",
                "<answer>The passage covers alpha [{c}].\n\nConclusion: alpha only.</answer>",
                "<answer>Nothing was checked here at all.\n\nConclusion: unclear.</answer>"][req.index].format(c=cite)
    value = 9 if "alpha and beta" in req.context else 3 if "alpha only" in req.context else 5
    scores = "".join(f'<score dim="{d}" value="{value}" reason="r"/>' for d in DIMS)
    return (f'<report_evaluations><report id="1"><verification>checked</verification><scores>{scores}</scores>'
            '</report></report_evaluations>')


def test_a_step_rewards_each_evaluation_by_hand_and_trains_its_tokens(tmp_path, tiny_ckpt, corpus_file):
    import lightning as L
    import torch

    from score_lightning.data.datamodule import QueryStream
    from score_lightning.data.queries import load_queries
    from score_lightning.launch.training import run
    from score_lightning.rollout.scripted import ScriptedEngine
    from score_lightning.step.batching import build_token_batch, policy_logprobs

    ids = [json.loads(line)["id"] for line in corpus_file.read_text().splitlines() if line.strip()]
    cfg = compose(FAST + [f"paths.output_dir={tmp_path / 'run'}", "trainer.max_steps=1", "optim.warmup_steps=0",
                          "harness.every_n_steps=10", "verifier.enabled=false", "evaluator.max_tool_calls=1",
                          "solver.max_response_tokens=160", "evaluator.max_response_tokens=200",
                          "evaluator.max_rubric_tokens=96", "reward.require_citation=true", "solver.num_rollouts=3",
                          "optim.micro_batch_size=3", "evaluator.scoring=pointwise",
                          "evaluator.scoring_reward=pairwise_recall", f"reward.items_path={tmp_path / 'items.jsonl'}"])
    query = QueryStream(load_queries(None, split="train"), 1, int(cfg.seed)).batch(0)
    item = {"weight": 1.0, "type": "binary", "evidence": ids}
    (tmp_path / "items.jsonl").write_text(json.dumps({
        "id": str(query["id"][0]), "prompt": query["prompt"][0],
        "rubrics": [dict(item, text="States alpha.", terms=["alpha"]),
                    dict(item, text="States beta.", terms=["beta"])]}) + "\n")
    seen: dict = {}

    def lp_sum(module, rows) -> float:
        batch = build_token_batch([r.prompt_ids for r in rows], [r.response_ids for r in rows],
                                  [r.train_mask for r in rows], module.tokenizer.pad_token_id)
        with torch.no_grad():
            lp, _ = policy_logprobs(module.policy, batch, float(module.cfg.evaluator.temperature))
        return float((lp * batch.loss_mask).sum())

    def hook(module, phase):  # after the evaluator's backward, before its step: the weights its forward saw
        if phase == "evaluator":
            ro = module.step_rollouts
            seen["rubric"] = lp_sum(module, [ro.rubrics.samples[0][0]])
            seen["scoring"] = lp_sum(module, [_Row(t) for t in ro.scoring])
            seen["first_before"] = lp_sum(module, [_Row(ro.scoring[0])])

    class Probe(L.Callback):
        def on_train_batch_end(self, trainer, module, *args):
            seen["step"] = module.last_step
            seen["first_after"] = lp_sum(module, [_Row(module.last_step["rollouts"].scoring[0])])

    def install(module):
        module.engine = module.evaluator_engine = ScriptedEngine(module.tokenizer, _respond)
        module.pre_step_hook = hook

    run(cfg, extra_callbacks=[Probe()], module_hook=install)
    step = seen["step"]
    sj, m, rw = step["scoring"], step["metrics"], step["rewards"]
    assert rw.validity.tolist() == [1.0, 1.0, 0.0] and rw.reports_valid == [True] * 3
    assert sj.rewards == pytest.approx([1.0, 0.5, 0.5])  # the hand computation of STEP.md's example
    assert sj.advantages == pytest.approx([1.0, 0.5, 0.5])  # b_0 = 0
    assert m["evaluator/scoring_pair_acc"] == pytest.approx(2 / 3)
    assert m["evaluator/scoring_rewarded_rate"] == pytest.approx(1.0)
    assert m["evaluator/scoring_baseline"] == pytest.approx(0.3 * 2 / 3)  # b_1 = 0.7 * 0 + 0.3 * mean
    # the update summed the rubric's and the three evaluations' log-probs: the scoring tokens trained
    assert m["evaluator/rubric_logprob"] == pytest.approx(seen["rubric"] + seen["scoring"], rel=1e-4)
    assert seen["first_after"] > seen["first_before"]  # advantage +1: the first evaluation became more likely


class _Row:
    """A scoring trajectory as an update row (its model tokens train)."""

    def __init__(self, t):
        self.prompt_ids, self.response_ids, self.train_mask = t.prompt_ids, t.response_ids, t.response_mask


def test_the_baseline_is_checkpointed_and_restored():
    """Resuming with b reset to 0 would hand the first scoring update after a resume a spurious advantage."""
    from score_lightning.step.scoring_reward import ScoringRewardStage

    a = ScoringRewardStage("pairwise_recall", 0.7)
    a.baseline.update(0.6)
    b = ScoringRewardStage("pairwise_recall", 0.7)
    b.load_state_dict({"score_step": 3, **a.state_dict()})
    assert b.baseline.value == pytest.approx(0.18) and b.baseline.steps == 1
    b.load_state_dict({"score_step": 3})  # a checkpoint from before the option existed: b stays where it was
    assert b.baseline.value == pytest.approx(0.18)
    with pytest.raises(ValueError, match="evaluator.scoring_reward='ranking'"):
        ScoringRewardStage("ranking", 0.7)
