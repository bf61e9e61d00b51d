"""The evaluator's own step (alpha = eta_e / eta_s as a learning-rate ratio) and the warmup schedules.

Adam's first step from a fresh state is lr * m_hat / (sqrt(v_hat) + eps) = lr * g / (|g| + eps), about
lr * sign(g): a factor on the loss cancels, a factor on the learning rate does not. So doubling alpha
must double the first evaluator step when alpha scales the evaluator's lr (``evaluator.optimizer:
own``), and barely change it when alpha weighted the loss through the solver's optimiser (``shared``).
"""

from __future__ import annotations

import pytest
import torch

from helpers import compose, recipe
from score_lightning.step.batching import build_token_batch, policy_logprobs
from score_lightning.step.optimizers import build_optimizers, loss_alpha, warmup_factor
from score_lightning.roles.rubric import Rubric
from score_lightning.step.evaluator_update import evaluator_update, reinforce_settings
from score_lightning.step.faults import guarded_step
from score_lightning.step.rollout_correction import rollout_correction
from score_lightning.step.solver_update import OptimizerHooks
from score_lightning.step.types import RubricSample

RUBRIC_XML = '<dimensions><dim name="factual_support" weight="0.50"/><dim name="clarity" weight="0.50"/></dimensions>'


def _cfg(*extra: str):
    # warmup off and a large lr: the step is ~1e-3 per weight, far above float32 rounding of the difference
    return compose(["experiment=tiny_score", "optim.lr=1e-3", "optim.warmup_steps=0", "loss.kl_coef=0", *extra])


def _build(cfg, policy, evaluator_policy=None):
    return build_optimizers(cfg.optim, cfg.evaluator, policy, evaluator_policy)


def _sample(tok) -> RubricSample:
    prompt = tok("Choose a rubric for: how do I parse JSON?", add_special_tokens=False)["input_ids"]
    resp = tok(RUBRIC_XML, add_special_tokens=False)["input_ids"]
    return RubricSample(Rubric(("factual_support", "clarity"), (0.5, 0.5)), True, "", prompt, resp, [1] * len(resp))


def _hooks(opt, params) -> OptimizerHooks:
    return OptimizerHooks(lambda loss: loss.backward(), lambda: guarded_step(opt, params, 1.0), torch.device("cpu"))


def _evaluator_step(cfg, policy, tok, built, advantage: float = 0.7) -> dict[str, torch.Tensor]:
    """One REINFORCE step through the evaluator's optimiser; returns each parameter's change."""
    params = [p for p in policy.parameters() if p.requires_grad]
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    settings = reinforce_settings(cfg.evaluator, cfg.loss, cfg.actor, rollout_correction(cfg.optim, cfg.loss,
                                                                                          cfg.rollout))
    evaluator_update(policy, None, [_sample(tok)], [advantage], settings, tok.pad_token_id,
                     _hooks(built.optimizers[built.evaluator], params))
    return {n: p.detach() - before[n] for n, p in policy.named_parameters()}


def _solver_step(policy, tok, built) -> None:
    """A stand-in solver update that fills the solver optimiser's Adam moments."""
    ids = tok("a report with a citation [json.loads]", add_special_tokens=False)["input_ids"]
    batch = build_token_batch([ids[:3]], [ids[3:]], [[1] * (len(ids) - 3)], tok.pad_token_id)
    lp, _ = policy_logprobs(policy, batch, 1.0)
    (-(lp * batch.loss_mask).sum()).backward()
    guarded_step(built.optimizers[built.solver], [p for p in policy.parameters() if p.requires_grad], 1.0)


def _moments(opt) -> list[torch.Tensor]:
    return [t.clone() for state in opt.state.values() for t in (state["exp_avg"], state["exp_avg_sq"], state["step"])]


def test_a_reinforce_step_leaves_the_solver_adam_moments_unchanged(tiny_ckpt, tokenizer):
    from score_lightning.policy.models import load_policy

    cfg = _cfg()
    policy = load_policy(tiny_ckpt)
    built = _build(cfg, policy)
    assert built.evaluator != built.solver and len(built.optimizers) == 2
    assert built.optimizers[built.evaluator].param_groups[0]["lr"] == pytest.approx(1e-3)  # alpha 1
    assert built.optimizers[built.evaluator].param_groups[0]["weight_decay"] == 0.0  # the solver's decays them
    _solver_step(policy, tokenizer, built)
    solver_opt = built.optimizers[built.solver]
    before = _moments(solver_opt)
    assert before, "the solver step made no Adam state"
    delta = _evaluator_step(cfg, policy, tokenizer, built)
    assert max(d.abs().max() for d in delta.values()) > 0  # the evaluator step moved the shared weights
    after = _moments(solver_opt)
    assert len(after) == len(before) and all(torch.equal(a, b) for a, b in zip(after, before))
    assert built.optimizers[built.evaluator].state, "the evaluator's own moments were not used"

    # contrast: through the solver's AdamW state (evaluator.optimizer=shared) its moments do move
    cfg = _cfg("evaluator.optimizer=shared")
    policy = load_policy(tiny_ckpt)
    built = _build(cfg, policy)
    assert built.evaluator == built.solver and len(built.optimizers) == 1
    _solver_step(policy, tokenizer, built)
    before = _moments(built.optimizers[built.solver])
    _evaluator_step(cfg, policy, tokenizer, built)
    assert not all(torch.equal(a, b) for a, b in zip(_moments(built.optimizers[built.solver]), before))


def _first_step_change(tiny_ckpt, tok, *extra: str) -> torch.Tensor:
    from score_lightning.policy.models import load_policy

    cfg = _cfg(*extra)
    policy = load_policy(tiny_ckpt)
    delta = _evaluator_step(cfg, policy, tok, _build(cfg, policy))
    return torch.cat([d.flatten() for d in delta.values()])


def test_doubling_alpha_doubles_the_first_evaluator_step(tiny_ckpt, tokenizer):
    one = _first_step_change(tiny_ckpt, tokenizer, "evaluator.alpha=1.0")
    two = _first_step_change(tiny_ckpt, tokenizer, "evaluator.alpha=2.0")
    assert one.abs().max() > 1e-4
    torch.testing.assert_close(two, 2 * one, rtol=1e-3, atol=1e-7)
    # why alpha is not a loss weight: through one AdamW, alpha = 2 moves the weights as alpha = 1 does
    one = _first_step_change(tiny_ckpt, tokenizer, "evaluator.alpha=1.0", "evaluator.optimizer=shared")
    two = _first_step_change(tiny_ckpt, tokenizer, "evaluator.alpha=2.0", "evaluator.optimizer=shared")
    assert float(two.norm() / one.norm()) == pytest.approx(1.0, abs=0.05)


def test_alpha_enters_the_loss_only_with_the_shared_optimiser():
    def alpha(*overrides: str) -> float:
        cfg = compose(["evaluator.alpha=3", *overrides])
        return loss_alpha(cfg.evaluator, cfg.actor)

    assert alpha() == 1.0
    assert alpha("evaluator.optimizer=shared") == 3.0
    assert alpha("actor.shared=false") == 1.0


def test_separate_evaluator_and_frozen_solver_get_the_right_optimisers(tiny_ckpt):
    from score_lightning.policy.models import load_policy

    cfg = compose(["actor.shared=false", "evaluator.alpha=0.5", "optim.weight_decay=0.01"])
    policy, judge = load_policy(tiny_ckpt), load_policy(tiny_ckpt)
    built = _build(cfg, policy, judge)
    solver, evaluator = built.optimizers[built.solver], built.optimizers[built.evaluator]
    assert evaluator.param_groups[0]["initial_lr"] == pytest.approx(0.5 * cfg.optim.lr)  # before the warmup factor
    assert evaluator.param_groups[0]["weight_decay"] == 0.01  # its own weights: its own decay
    assert {id(p) for p in evaluator.param_groups[0]["params"]}.isdisjoint(
        {id(p) for p in solver.param_groups[0]["params"]})
    policy.requires_grad_(False)  # solver.freeze
    built = _build(cfg, policy, judge)
    assert built.solver is None and built.evaluator == 0 and len(built.optimizers) == 1
    built = _build(compose(["evaluator.enabled=false"]), load_policy(tiny_ckpt))
    assert built.evaluator is None and len(built.optimizers) == 1


def test_warmup_schedules_by_hand():
    paper = compose([*recipe("qwen_score")])
    steps = warmup_factor(paper.optim)
    assert [steps(s) for s in range(7)] == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.0])  # verl, 5 steps from 0
    start = compose(["optim.warmup_steps=4", "optim.warmup_start_ratio=0.2"])
    f = warmup_factor(start.optim)
    assert [f(s) for s in range(5)] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    # the schedule is optim.warmup_steps and optim.warmup_start_ratio alone: the run's length changes nothing
    longer = compose(["optim.warmup_steps=4", "optim.warmup_start_ratio=0.2", "trainer.max_steps=1000"])
    assert [warmup_factor(longer.optim)(s) for s in range(5)] == [f(s) for s in range(5)]
    assert warmup_factor(compose(["optim.warmup_steps=0"]).optim)(0) == 1.0
