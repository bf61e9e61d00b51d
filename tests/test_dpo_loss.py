"""The DPO baseline's pure parts: its loss equals TRL 1.16's on equal inputs, and its pairs and sums by hand.

TRL's ``DPOTrainer._compute_loss`` is called unbound on a stand-in ``self`` holding only the attributes it reads,
with a stand-in model that returns given per-token log-probs the way TRL's fused LM head does (zero where the
label is ``-100``); the reference log-probs are handed in precomputed (TRL's ``precompute_ref_logps``). Nothing of
TRL's loss is copied: the comparison runs TRL's own code, values and gradients w.r.t. the policy log-probs.
"""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("trl", reason="TRL 1.16 (the test extra) is the reference implementation these tests call")

from score_lightning.methods.dpo.loss import dpo_loss, select_pairs, sequence_logps  # noqa: E402

P, T = 4, 10  # pairs, tokens per sequence
TOL = 1e-12  # float64 throughout: equal up to rounding
GARBAGE = -50.0  # a log-prob on a token the model did not write; must count nowhere


class _Accelerator:
    device = torch.device("cpu")

    @staticmethod
    def gather(x):
        return x

    gather_for_metrics = gather


def trl_dpo(token_logps, completion_mask, ref_chosen, ref_rejected, *, beta, loss_type, label_smoothing):
    """TRL 1.16's DPO loss (the batch mean) and its logged metrics; rows are ``[chosen..., rejected...]``."""
    from trl.trainer.dpo_trainer import DPOTrainer
    from trl.trainer.utils import FusedCausalLMOutput

    def model(*, labels, fused_lm_head, **_):
        assert fused_lm_head
        zeros = torch.zeros_like(token_logps)
        return FusedCausalLMOutput(log_probs=token_logps.masked_fill(labels[:, 1:] == -100, 0.0), entropy=zeros,
                                   mean_logits=zeros, is_top1=zeros.bool())

    metrics = defaultdict(lambda: defaultdict(list))
    stand_in = SimpleNamespace(
        model=SimpleNamespace(training=True), accelerator=_Accelerator(), aux_loss_enabled=False, ld_alpha=None,
        precompute_ref_logps=True, f_divergence_type="reverse_kl", loss_types=[loss_type], loss_weights=[1.0],
        beta=beta, label_smoothing=label_smoothing, use_weighting=False, _metrics=metrics,
        _total_train_tokens=0, _tp_size=1, args=SimpleNamespace())
    n = completion_mask.shape[0]
    inputs = {"input_ids": torch.arange(n * T).view(n, T) % 7 + 1, "attention_mask": torch.ones(n, T, dtype=torch.long),
              "completion_mask": completion_mask.long(), "ref_chosen_logps": ref_chosen,
              "ref_rejected_logps": ref_rejected}
    loss = DPOTrainer._compute_loss(stand_in, model, inputs, return_outputs=False)
    return loss, {k: v[-1] for k, v in metrics["train"].items()}


def inputs(seed: int):
    """Random policy token log-probs ``[2P, T-1]`` (aligned to ``completion_mask[:, 1:]``), a mask with a prompt,
    tool-observation tokens inside the response and padding, and random reference sequence log-probs."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(2 * P, T, dtype=torch.long)
    for row in range(2 * P):
        end = int(torch.randint(5, T + 1, (1,), generator=g))
        mask[row, 2:end] = 1  # two prompt tokens, then the response, then padding
        if row % 2:
            mask[row, 4:6] = 0  # a tool observation inside the response
    token_logps = -3 * torch.rand(2 * P, T - 1, generator=g, dtype=torch.float64)
    token_logps = token_logps.masked_fill(mask[:, 1:] == 0, GARBAGE)
    ref = -3 * (T - 3) * torch.rand(2 * P, generator=g, dtype=torch.float64)
    return token_logps, mask, ref[:P], ref[P:]


def ours(token_logps, mask, ref_chosen, ref_rejected, **kw):
    policy = sequence_logps(token_logps, mask[:, 1:])
    return dpo_loss(policy[:P], policy[P:], ref_chosen, ref_rejected, **kw)


CASES = [("sigmoid", 0.0), ("robust", 0.0), ("robust", 0.1)]


@pytest.mark.parametrize("loss_type, label_smoothing", CASES)
@pytest.mark.parametrize("beta", [0.05, 0.1, 0.5, 2.0])
def test_loss_values_gradients_and_rewards_equal_trls(loss_type, label_smoothing, beta):
    kw = dict(beta=beta, loss_type=loss_type, label_smoothing=label_smoothing)
    for seed in range(3):
        logp0, mask, ref_c, ref_r = inputs(seed)
        a = logp0.clone().requires_grad_(True)
        theirs, logged = trl_dpo(a, mask, ref_c, ref_r, **kw)
        theirs.backward()
        b = logp0.clone().requires_grad_(True)
        per_pair, chosen_rewards, rejected_rewards = ours(b, mask, ref_c, ref_r, **kw)
        per_pair.mean().backward()
        assert abs(float(per_pair.detach().mean()) - float(theirs.detach())) <= TOL, seed
        assert float((a.grad - b.grad).abs().max()) <= TOL, seed
        assert float(a.grad.abs().max()) > 1e-3  # the gradient compared is not trivially zero
        assert float(b.grad[mask[:, 1:] == 0].abs().max()) == 0.0  # nothing reaches an unwritten token
        assert math.isclose(logged["rewards/chosen"], float(chosen_rewards.mean()), abs_tol=1e-9)
        assert math.isclose(logged["rewards/rejected"], float(rejected_rewards.mean()), abs_tol=1e-9)
        assert math.isclose(logged["rewards/margins"], float((chosen_rewards - rejected_rewards).mean()),
                            abs_tol=1e-9)
        assert not chosen_rewards.requires_grad and not rejected_rewards.requires_grad
        # per pair: TRL on each pair alone
        for p in range(P):
            rows = torch.tensor([p, P + p])
            one, _ = trl_dpo(logp0[rows], mask[rows], ref_c[p:p + 1], ref_r[p:p + 1], **kw)
            assert abs(float(one) - float(per_pair[p].detach())) <= TOL, (seed, p)


def test_the_loss_by_hand():
    # chosen log-ratio -1 - (-2) = 1, rejected -3 - (-2) = -1: beta * delta = 0.5 * 2 = 1
    loss, rc, rr = dpo_loss(torch.tensor([-1.0]), torch.tensor([-3.0]), torch.tensor([-2.0]), torch.tensor([-2.0]),
                            beta=0.5)
    assert math.isclose(float(loss), math.log(1 + math.exp(-1)), rel_tol=1e-6)  # 0.31326
    assert (float(rc), float(rr)) == (0.5, -0.5)
    # robust, eps 0.1: (0.9 * log(1 + e^-1) - 0.1 * log(1 + e^1)) / 0.8
    robust, _, _ = dpo_loss(torch.tensor([-1.0]), torch.tensor([-3.0]), torch.tensor([-2.0]), torch.tensor([-2.0]),
                            beta=0.5, loss_type="robust", label_smoothing=0.1)
    want = (0.9 * math.log(1 + math.exp(-1)) - 0.1 * math.log(1 + math.exp(1))) / 0.8
    assert math.isclose(float(robust), want, rel_tol=1e-6)


def test_what_the_loss_refuses():
    x = torch.zeros(1)
    with pytest.raises(ValueError, match="needs loss_type='robust'"):
        dpo_loss(x, x, x, x, beta=0.1, label_smoothing=0.1)  # TRL's sigmoid would silently ignore it
    with pytest.raises(ValueError, match=r"\[0, 0.5\)"):
        dpo_loss(x, x, x, x, beta=0.1, loss_type="robust", label_smoothing=0.5)
    with pytest.raises(ValueError, match="loss_type must be one of"):
        dpo_loss(x, x, x, x, beta=0.1, loss_type="ipo")
    with pytest.raises(ValueError, match="beta must be > 0"):
        dpo_loss(x, x, x, x, beta=0.0)


def test_sequence_logps_sums_the_written_tokens_only():
    token_logps = torch.tensor([[-1.0, -2.0, -3.0, -4.0],
                                [-0.5, float("-inf"), -1.5, float("nan")]], requires_grad=True)
    # row 0: token 1 is a tool observation; row 1: an observation (-inf) and a padded nan
    mask = torch.tensor([[1, 0, 1, 1], [1, 0, 1, 0]])
    out = sequence_logps(token_logps, mask)
    assert out.tolist() == [-8.0, -2.0]
    out.sum().backward()
    assert token_logps.grad.tolist() == [[1.0, 0.0, 1.0, 1.0], [1.0, 0.0, 1.0, 0.0]]
    with pytest.raises(ValueError, match="differ in shape"):
        sequence_logps(token_logps, mask[:, :3])


def test_select_pairs_by_hand():
    # query-major, k = 3: a clear best and worst; all equal (no pair); two equal best (the lower row wins)
    assert select_pairs([0.2, 0.9, 0.1, 0.5, 0.5, 0.5, 0.3, 0.7, 0.7], k=3) == [(1, 2), (7, 6)]
    assert select_pairs([0.1, 0.4, 0.1], k=3) == [(1, 0)]  # two equal worst: the lower row
    assert select_pairs([1.0, 0.0, 0.0, 1.0], k=2) == [(0, 1), (3, 2)]  # each query's rows only
    assert select_pairs([0.5], k=1) == []  # one report: nothing to compare


def test_select_pairs_leaves_unjudged_reports_out():
    # rows 0 and 3 unjudged: their zeros are no "worst"
    assert select_pairs([0.0, 0.8, 0.3, 0.0], k=4, judged=[False, True, True, False]) == [(1, 2)]
    assert select_pairs([0.0, 0.8, 0.3, 0.0], k=4) == [(1, 0)]  # judged=None: every row counts
    # one judged report left; or the judged ones all equal (the unjudged one differs)
    assert select_pairs([0.9, 0.0, 0.4, 0.4, 0.0], k=5, judged=[True, False, False, False, False]) == []
    assert select_pairs([0.4, 0.0, 0.4], k=3, judged=[True, False, True]) == []
    # an unjudged row may hold anything, a judged one must be a number
    assert select_pairs([float("nan"), 0.2, 0.6], k=3, judged=[False, True, True]) == [(2, 1)]
    with pytest.raises(ValueError, match="not finite"):
        select_pairs([float("nan"), 0.2, 0.6], k=3)


def test_select_pairs_refuses_a_bad_layout():
    with pytest.raises(ValueError, match="whole groups"):
        select_pairs([0.1, 0.2, 0.3], k=2)
    with pytest.raises(ValueError, match="judged has 2 entries"):
        select_pairs([0.1, 0.2, 0.3, 0.4], k=2, judged=[True, True])
    with pytest.raises(ValueError, match="k must be >= 1"):
        select_pairs([], k=0)
