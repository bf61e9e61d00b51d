"""At equal inputs, each loss variant's value (and gradient) equals TRL 1.16's, computed by TRL's own code.

TRL's ``GRPOTrainer._compute_loss`` is called unbound on a stand-in ``self`` that holds only the attributes
it reads, with the per-token log-probs handed to it instead of a model forward; nothing of TRL is copied.
Our side is :mod:`score_lightning.step.loss_registry`: the micro-batch numerator times :func:`loss_scale` with
the counts ``solver_update`` would pass. TRL's ``grpo`` (a per-sequence token mean, the GRPO paper's 1/|o_i|)
is our ``grpo_seq_mean``; our ``grpo`` keeps the exact token mean of the mini-batch (verl's token-mean).
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("trl", reason="TRL 1.16 (the test extra) is the reference implementation these tests call")

from score_lightning.step.loss_registry import loss_scale, policy_loss  # noqa: E402
from score_lightning.step.loss_variants import sequence_token_means  # noqa: E402
from score_lightning.step.losses import clipped_surrogate, k3_kl  # noqa: E402

B, T, MAX_LEN = 4, 7, 12
TOL = 1e-6


class _Accelerator:
    num_processes = 1

    @staticmethod
    def gather(x):
        return x

    gather_for_metrics = gather

    @staticmethod
    def reduce(x, reduction="sum"):
        return x


def trl_loss(loss_type: str, logp, old, ref, adv, mask, *, eps_low: float, eps_high: float, beta: float,
             level: str = "token", is_ratio=None, bias_kl: bool = False, grad_accum: int = 1,
             steps_per_generation: int = 1, num_items: float | None = None):
    """TRL 1.16's ``_compute_loss`` on these tensors (one process)."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    stand_in = SimpleNamespace(
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level=level, beta=beta,
        loss_type=loss_type, epsilon_low=eps_low, epsilon_high=eps_high, use_vllm=is_ratio is not None,
        vllm_importance_sampling_correction=is_ratio is not None, model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=grad_accum, accelerator=_Accelerator(), max_completion_length=MAX_LEN,
        _entropy_bonus_enabled=False, aux_loss_enabled=False, _metrics=defaultdict(lambda: defaultdict(list)),
        args=SimpleNamespace(use_bias_correction_kl=bias_kl, delta=None, steps_per_generation=steps_per_generation),
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, torch.zeros_like(logp), None))
    n = logp.shape[0]
    inputs = {"prompt_ids": torch.ones(n, 2, dtype=torch.long), "prompt_mask": torch.ones(n, 2, dtype=torch.long),
              "completion_ids": torch.ones(n, logp.shape[1], dtype=torch.long), "completion_mask": mask.long(),
              "advantages": adv, "old_per_token_logps": old, "ref_per_token_logps": ref,
              "num_items_in_batch": torch.tensor(float(mask.sum() if num_items is None else num_items))}
    if is_ratio is not None:
        inputs["importance_sampling_ratio"] = is_ratio
    return GRPOTrainer._compute_loss(stand_in, None, inputs)


def inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g) * 3
    old = logp + 0.25 * torch.randn(B, T, generator=g)  # ratios on both sides of the clip band
    ref = logp + 0.3 * torch.randn(B, T, generator=g)
    lengths = torch.tensor([7, 3, 5, 1])  # uneven, every row non-empty
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    adv = torch.randn(B, generator=g)
    is_ratio = torch.rand(B, T, generator=g) + 0.5
    return logp, old, ref, mask, adv, is_ratio


def ours(loss_type, logp, old, ref, adv, mask, *, clip_low, clip_high, beta, is_weight=None, bias_kl=False, **counts):
    total, st = policy_loss(logp, old, ref, adv, mask, loss_type=loss_type, clip_low=clip_low, clip_high=clip_high,
                            kl_coef=beta, is_weight=is_weight, kl_is_weighted=bias_kl)
    defaults = dict(world=1, mini_tokens=float(mask.sum()), step_tokens=float(mask.sum()),
                    mini_sequences=float(st["sequences"]),
                    micro_tokens=float(st["tokens"]), max_len=MAX_LEN, mini_trajectories=float(mask.shape[0]))
    return total * loss_scale(loss_type, **{**defaults, **counts})


# our loss_type -> (TRL loss_type, importance_sampling_level, how TRL's clip is spelt)
CASES = {"dapo": ("dapo", "token"), "bnpo": ("bnpo", "token"), "dr_grpo": ("dr_grpo", "token"),
         "gspo": ("grpo", "sequence"), "cispo": ("cispo", "token"), "grpo_seq_mean": ("grpo", "token")}


def compare(loss_type: str, seed: int, beta: float, with_is: bool, bias_kl: bool) -> tuple[float, float]:
    """(max |value difference|, max |gradient difference|) between ours and TRL's on one set of inputs."""
    logp0, old, ref, mask, adv, is_ratio = inputs(seed)
    trl_type, level = CASES[loss_type]
    clip_low, clip_high = (1.0, 2.0) if loss_type == "cispo" else (0.2, 0.28)
    # TRL's cispo clamps the ratio above at epsilon_high (its ScaleRL eps_max), with no lower bound: ours with
    # clip_low=1 (lower bound 0) and clip_high = epsilon_high - 1
    eps_high = 1.0 + clip_high if loss_type == "cispo" else clip_high
    w = is_ratio if with_is else None
    a = logp0.clone().requires_grad_(True)
    theirs = trl_loss(trl_type, a, old, ref, adv, mask, eps_low=0.2, eps_high=eps_high, beta=beta, level=level,
                      is_ratio=w, bias_kl=bias_kl)
    theirs.backward()
    b = logp0.clone().requires_grad_(True)
    mine = ours(loss_type, b, old, ref, adv, mask, clip_low=clip_low, clip_high=clip_high, beta=beta, is_weight=w,
                bias_kl=bias_kl)
    mine.backward()
    value = abs(float(mine.detach()) - float(theirs.detach()))
    # gradients are defined equal except where GSPO meets a per-token factor: a token-level rollout weight or the
    # KL weighted by the sequence ratio. TRL's s = exp(mean log r) then carries each token's factor to every token
    # of the sequence; the GSPO-token form (verl's gspo, ours) keeps it on its own token. Values are equal.
    token_factor = loss_type == "gspo" and (with_is or (bias_kl and beta))
    grad = float("nan") if token_factor else float((a.grad - b.grad).abs().max())
    return value, grad


@pytest.mark.parametrize("loss_type", sorted(CASES))
@pytest.mark.parametrize("beta, with_is, bias_kl", [(0.0, False, False), (0.04, False, False), (0.04, True, False),
                                                    (0.04, True, True)])
def test_each_variant_equals_trl(loss_type, beta, with_is, bias_kl):
    for seed in range(3):
        value, grad = compare(loss_type, seed, beta, with_is, bias_kl)
        assert value <= TOL, (loss_type, seed, value)
        assert grad != grad or grad <= TOL, (loss_type, seed, grad)  # nan: not defined equal (see compare)


def test_trl_grpo_is_our_grpo_seq_mean_and_not_our_grpo():
    for seed in range(3):
        logp, old, ref, mask, adv, _ = inputs(seed)
        theirs = trl_loss("grpo", logp, old, ref, adv, mask, eps_low=0.2, eps_high=0.28, beta=0.04)
        pg, _ = clipped_surrogate(logp, old, adv, clip_low=0.2, clip_high=0.28)
        by_hand = sequence_token_means(pg + 0.04 * k3_kl(logp, ref), mask).mean()  # each row's token mean, averaged
        seq_mean = ours("grpo_seq_mean", logp, old, ref, adv, mask, clip_low=0.2, clip_high=0.28, beta=0.04)
        assert abs(float(by_hand) - float(theirs)) <= TOL and abs(float(seq_mean) - float(theirs)) <= TOL
        # and it is not our grpo (the exact token mean): the rows' lengths differ
        assert abs(float(ours("grpo", logp, old, ref, adv, mask, clip_low=0.2, clip_high=0.28, beta=0.04)) -
                   float(theirs)) > 1e-3


def test_accumulation_and_generation_batches_map_onto_the_normalisers():
    """bnpo over 2 accumulated micro-batches, dr_grpo's constant and grpo_seq_mean's sequences over them, and dapo
    with 2 optimiser steps per generation batch (TRL's steps_per_generation): our counts reproduce TRL's normalisers."""
    logp, old, ref, mask, adv, _ = inputs(5)
    halves = [slice(0, 2), slice(2, 4)]
    n_all = float(mask.sum())
    for h in halves:
        args = (logp[h], old[h], ref[h], adv[h], mask[h])
        kw = dict(eps_low=0.2, eps_high=0.28, beta=0.04)
        ok = dict(clip_low=0.2, clip_high=0.28, beta=0.04)
        theirs = trl_loss("bnpo", *args, grad_accum=2, **kw)
        assert abs(float(ours("bnpo", *args, micro_batches=2, **ok)) - float(theirs)) <= TOL
        theirs = trl_loss("dr_grpo", *args, grad_accum=2, **kw)
        assert abs(float(ours("dr_grpo", *args, mini_trajectories=4.0, **ok)) - float(theirs)) <= TOL
        theirs = trl_loss("grpo", *args, grad_accum=2, **kw)  # its micro-batch's row mean / 2: 2 rows of 4 here
        assert abs(float(ours("grpo_seq_mean", *args, mini_sequences=4.0, **ok)) - float(theirs)) <= TOL
        theirs = trl_loss("dapo", *args, steps_per_generation=2, num_items=n_all, **kw)
        assert abs(float(ours("dapo", *args, step_tokens=n_all, mini_batches=2, **ok)) - float(theirs)) <= TOL


def max_differences(seeds=range(10)) -> dict[str, tuple[float, float]]:
    """The figures of the closing note: per loss_type, the largest value and gradient difference over seeds and
    the four settings of :func:`test_each_variant_equals_trl` (``python tests/test_loss_trl.py``)."""
    out = {}
    for loss_type in sorted(CASES):
        diffs = [compare(loss_type, s, beta, w, bk) for s in seeds
                 for beta, w, bk in [(0.0, False, False), (0.04, False, False), (0.04, True, False), (0.04, True, True)]]
        out[loss_type] = (max(v for v, _ in diffs), max(g for _, g in diffs if g == g))
    return out


if __name__ == "__main__":
    for name, (value, grad) in max_differences().items():
        print(f"{name}: max |value - TRL| = {value:.2e}, max |grad - TRL| = {grad:.2e}")
