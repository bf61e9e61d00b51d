"""A real SCORE step with ``optim.rollout_correction=sequence_mask`` and engine log-probs that disagree.

The scripted engine of tests/test_score_step.py writes the responses (non-zero rewards, known by hand), and
reports as its log-probs the trainer's own log-probs of what it wrote, except for query b's solver
trajectories and the rubric, whose log-probs are 1 nat lower on every token. Their sequence ratios are
then e^(tokens) >> C_max = 3, so they are masked; query a's ratios are 1 to rounding. Checked:

* the solver's gradient is, to float rounding, the hand-computed gradient of query a's surrogate alone
  (divided by the token count of both queries), and differs from the gradient with query b in it;
* the logged weights, masked share and mismatch statistics equal their values by hand from the token counts;
* the masked rubric gets no REINFORCE gradient: the evaluator's step leaves its log-prob where it was.
"""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch

from helpers import FAST, compose
from score_lightning.data.datamodule import QueryStream
from score_lightning.data.queries import load_queries
from score_lightning.rollout.scripted import ScriptedEngine
from score_lightning.step.batching import build_token_batch, policy_logprobs
from score_lightning.step.losses import clipped_surrogate, masked_sum
from test_score_step import StepScript, _hand_advantages, _seq_logprob

SHIFT = 1.0  # nats by which the engine under-reports query b's and the rubric's tokens


class EchoEngine:
    """The scripted engine, reporting the trainer's log-probs of its own tokens (shifted for chosen requests)."""

    def __init__(self, module, script, shifted):
        self.module, self.inner, self.shifted = module, ScriptedEngine(module.tokenizer, script), shifted

    def sync_weights(self, named_tensors) -> None:
        return None

    def generate(self, prompts, params):
        gens = self.inner.generate(prompts, params)
        requests = self.inner.requests[-len(prompts):]
        temperature = params.temperature if params.temperature > 0 else 1.0
        for p, g, req in zip(prompts, gens, requests):
            n = len(g.token_ids)
            if not n:
                continue
            batch = build_token_batch([list(p)], [g.token_ids], [[1] * n], self.module.tokenizer.pad_token_id)
            with torch.no_grad():
                lp, _ = policy_logprobs(self.module.policy, batch, temperature)
            g.logprobs = (lp[0, len(p) - 1:len(p) - 1 + n] - (SHIFT if self.shifted(req) else 0.0)).tolist()
        return gens


def _surrogate_grad(module, trajs, adv: list[float], tokens: float) -> list[torch.Tensor]:
    """d/dtheta of sum over these trajectories' model tokens of the on-policy clipped surrogate, / tokens."""
    temp = float(module.cfg.solver.temperature)
    batch = build_token_batch([t.prompt_ids for t in trajs], [t.response_ids for t in trajs],
                              [t.response_mask for t in trajs], module.tokenizer.pad_token_id)
    logp, _ = policy_logprobs(module.policy, batch, temp)
    pg, _ = clipped_surrogate(logp, logp.detach(), torch.tensor(adv))
    params = [p for p in module.policy.parameters() if p.requires_grad]
    grads = torch.autograd.grad(masked_sum(pg, batch.loss_mask) / tokens, params, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]


class Probe(L.Callback):
    def __init__(self):
        self.grad = self.expected = self.with_b = None
        self.rubric_lp: list[float] = []
        self.step = None

    def hook(self, module, phase):
        ro = module.step_rollouts
        if phase == "solver":
            params = [p for p in module.policy.parameters() if p.requires_grad]
            self.grad = torch.cat([p.grad.flatten() for p in params])
            tokens = float(sum(t.num_model_tokens for t in ro.solver))  # the global token mean counts both queries
            qa, qb = ro.solver[:3], ro.solver[3:]
            ga = _surrogate_grad(module, qa, _hand_advantages([1 + 0.5 * 0.8 + 0.3 * 0.6 + 0.2 * 0.4, 1 + 0.4, 0.0]),
                                 tokens)
            gb = _surrogate_grad(module, qb, _hand_advantages([1.0, 1.0, 0.0]), tokens)
            self.expected = torch.cat([g.flatten() for g in ga])
            self.with_b = torch.cat([(a + b).flatten() for a, b in zip(ga, gb)])
        if phase == "evaluator":
            s = ro.rubrics.samples[0][0]
            self.rubric_lp.append(_seq_logprob(module.policy, s.prompt_ids, s.response_ids, s.train_mask,
                                               module.tokenizer.pad_token_id, float(module.cfg.evaluator.temperature)))

    def on_train_batch_end(self, trainer, module, *args):
        self.step = module.last_step
        s = self.step["rollouts"].rubrics.samples[0][0]
        self.rubric_lp.append(_seq_logprob(module.policy, s.prompt_ids, s.response_ids, s.train_mask,
                                           module.tokenizer.pad_token_id, float(module.cfg.evaluator.temperature)))


@pytest.fixture(scope="module")
def masked_step(tmp_path_factory, tiny_ckpt, corpus_file):
    from score_lightning.launch.training import run

    overrides = FAST + [
        f"paths.output_dir={tmp_path_factory.mktemp('iscorr')}", "trainer.max_steps=1", "data.batch_size=2",
        "optim.mini_batch_size=2", "solver.num_rollouts=3", "optim.micro_batch_size=3",
        "solver.max_response_tokens=160",
        "evaluator.max_response_tokens=400", "evaluator.max_rubric_tokens=96", "solver.max_tool_calls=1",
        "evaluator.max_tool_calls=1", "reward.require_citation=true", "verifier.min_search_depth=1",
        "harness.initial_state.process_constraints.require_verification=true", "harness.every_n_steps=10",
        "optim.lr=1e-4", "optim.warmup_steps=0", "loss.kl_coef=0", "evaluator.scoring=joint",
        "optim.rollout_correction=sequence_mask",
    ]
    cfg = compose(overrides)
    stream = QueryStream(load_queries(None, split="train"), 2, int(cfg.seed))
    step1 = stream.batch(0)["prompt"]
    script = StepScript(step1, stream.batch(1)["prompt"])
    probe = Probe()

    def shifted(req) -> bool:
        return req.role == "rubric" or (req.role == "solver" and req.query == step1[1])

    def install(module):
        module.engine = module.evaluator_engine = EchoEngine(module, script, shifted)
        module.pre_step_hook = probe.hook

    run(cfg, extra_callbacks=[probe], module_hook=install)
    return probe


def test_rewards_are_the_hand_computed_non_zero_ones(masked_step):
    rw = masked_step.step["rewards"]
    assert rw.rewards.tolist() == pytest.approx([1.66, 1.4, 0.0, 1.0, 1.0, 0.0], abs=1e-6)
    hand = _hand_advantages([1.66, 1.4, 0.0]) + _hand_advantages([1.0, 1.0, 0.0])
    assert masked_step.step["solver"].advantages.tolist() == pytest.approx(hand, abs=1e-5)  # none is 0


def test_masked_sequences_contribute_no_policy_gradient(masked_step):
    got, expected, with_b = masked_step.grad, masked_step.expected, masked_step.with_b
    scale = float(expected.abs().max())
    assert scale > 0
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5 * scale)
    assert float((with_b - expected).abs().max()) > 0.1 * scale  # query b's gradient would have been visible


def test_logged_correction_scalars_by_hand(masked_step):
    m, solver = masked_step.step["metrics"], masked_step.step["rollouts"].solver
    ta = sum(t.num_model_tokens for t in solver[:3])
    tb = sum(t.num_model_tokens for t in solver[3:])
    n = ta + tb
    assert m["rollout/is_masked_frac"] == pytest.approx(tb / n)
    assert m["rollout/is_weight_mean"] == pytest.approx(ta / n, abs=1e-4)  # query a: rho = 1 to rounding
    assert m["rollout/mismatch_kl"] == pytest.approx(tb * (math.e - 1 - 1) / n, abs=1e-4)  # k3 at log rho = 1
    assert m["rollout/mismatch_k1"] == pytest.approx(-tb / n, abs=1e-4)
    assert m["rollout/ppl_ratio"] == pytest.approx(math.exp(-tb / n), abs=1e-4)
    assert m["rollout/logprob_diff"] == pytest.approx(tb / n, abs=1e-4)
    assert "rollout/is_clipped_frac" not in m


def test_masked_rubric_is_not_moved_by_the_evaluator_step(masked_step):
    m = masked_step.step["metrics"]
    assert m["evaluator/updated"] == 1.0
    assert m["evaluator/is_masked_frac"] == 1.0 and m["evaluator/is_weight_mean"] == 0.0
    before, after = masked_step.rubric_lp
    assert after == pytest.approx(before, abs=1e-6)
