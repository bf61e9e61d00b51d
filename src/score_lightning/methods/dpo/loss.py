"""The DPO baseline's maths, pure: which reports form a pair, what a report's log-probability is, the loss.

*Online DPO from the step's own scored groups.* The paper's DPO baseline needs no preference data set: each step
already writes ``k`` reports per query and scores them with the reward the run computes anyway. Of every query's
judged reports, the best (highest reward) is the chosen and the worst (lowest reward) the rejected response;
a query whose judged reports all score the same says nothing about which is better and gives no pair
(:func:`select_pairs`). The reference is the frozen model the run already keeps for its KL term, so DPO costs
no extra model. A report's log-probability sums only the tokens the model wrote (:func:`sequence_logps`):
retrieved passages and tool observations were not sampled from the policy and carry no preference.

*What it matches in TRL.* :func:`dpo_loss` equals TRL 1.16's ``DPOTrainer`` loss on equal inputs, values and
gradients (``tests/test_dpo_loss.py`` calls TRL's own ``_compute_loss``): ``loss_type="sigmoid"`` (Rafailov et
al.'s DPO, TRL's default with ``f_divergence_type="reverse_kl"``) and ``loss_type="robust"`` (TRL's label
smoothing: Chowdhury et al.'s robust DPO, a label flipped with probability ``label_smoothing``). TRL 1.16's
sigmoid loss reads no label smoothing (its conservative cDPO form is gone), so ``sigmoid`` refuses a non-zero
one rather than ignoring it. TRL's ``ipo`` divides by each response's token count, inputs this function does
not take, so it is not offered.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["LOSS_TYPES", "sequence_logps", "dpo_loss", "select_pairs"]

#: The loss types :func:`dpo_loss` computes, each checked against TRL 1.16's code of the same name.
LOSS_TYPES = ("sigmoid", "robust")


def sequence_logps(token_logps: Tensor, mask: Tensor) -> Tensor:
    """Per row, the sum of the log-probs of the tokens the model wrote (``mask`` 1): the quantity DPO compares.

    ``token_logps`` and ``mask`` are ``[B, T]``; prompt, tool-observation and padding tokens (``mask`` 0) are
    selected out rather than multiplied by 0, so a ``-inf`` or ``nan`` there neither leaks into the sum nor into
    the gradient. Returns ``[B]``.
    """
    if token_logps.shape != mask.shape:
        raise ValueError(f"token_logps {tuple(token_logps.shape)} and mask {tuple(mask.shape)} differ in shape")
    return torch.where(mask.bool(), token_logps, torch.zeros_like(token_logps)).sum(dim=-1)


def dpo_loss(policy_chosen: Tensor, policy_rejected: Tensor, ref_chosen: Tensor, ref_rejected: Tensor,
             beta: float, loss_type: str = "sigmoid", label_smoothing: float = 0.0,
             ) -> tuple[Tensor, Tensor, Tensor]:
    """DPO's loss per pair, and each side's implicit reward, from sequence log-probs (all ``[P]``).

    ``chosen_logratio = policy_chosen - ref_chosen`` is how much more likely the policy makes the chosen report
    than the reference did; the loss pushes it above the rejected report's, scaled by ``beta`` (larger ``beta``:
    a sharper preference and, by DPO's derivation, a stronger pull back to the reference).

    - ``sigmoid``: ``-logsigmoid(beta * delta)`` with ``delta = chosen_logratio - rejected_logratio``, the
      Bradley-Terry likelihood of the observed preference (Rafailov et al., eq. 7); ``label_smoothing`` must be 0.
    - ``robust``: with ``eps = label_smoothing`` in ``[0, 0.5)``, the probability that a pair's order is wrong
      (a noisy judge), ``(-(1 - eps) * logsigmoid(beta * delta) + eps * logsigmoid(-beta * delta)) / (1 - 2 eps)``,
      an unbiased estimate of the clean loss under flipped labels (Chowdhury et al.); ``eps = 0`` is ``sigmoid``.

    The rewards ``beta * (policy - ref)`` are detached: they are what DPO's loss implicitly ranks by, logged to
    see whether chosen rises above rejected, never differentiated. The caller reduces the loss (TRL: the mean).
    """
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    chosen_logratio = policy_chosen - ref_chosen
    rejected_logratio = policy_rejected - ref_rejected
    logits = beta * (chosen_logratio - rejected_logratio)
    if loss_type == "sigmoid":
        if label_smoothing != 0.0:
            raise ValueError(f"label_smoothing={label_smoothing} needs loss_type='robust'; TRL's sigmoid DPO "
                             "has no label smoothing")
        loss = -F.logsigmoid(logits)
    elif loss_type == "robust":
        if not 0.0 <= label_smoothing < 0.5:
            raise ValueError(f"label_smoothing must lie in [0, 0.5) for loss_type='robust', got {label_smoothing}")
        eps = label_smoothing
        loss = (-(1 - eps) * F.logsigmoid(logits) + eps * F.logsigmoid(-logits)) / (1 - 2 * eps)
    else:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    return loss, beta * chosen_logratio.detach(), beta * rejected_logratio.detach()


def select_pairs(rewards: Sequence[float], k: int, judged: Sequence[bool] | None = None) -> list[tuple[int, int]]:
    """Per query, the ``(chosen, rejected)`` row indices of its best and worst judged report.

    ``rewards`` is query-major: query ``i`` owns rows ``i*k .. i*k+k-1``. Only judged rows compete (an unjudged
    report's reward is no score: a failed call is counted, never scored); ``judged=None`` means all are.
    A query with fewer than two judged reports, or whose judged rewards are all equal, gives no pair. Among equal
    best (or equal worst) rewards the lowest row index wins, so the pairs do not depend on sort stability or
    on the order ties were produced in. Pairs come in query order.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if len(rewards) % k:
        raise ValueError(f"{len(rewards)} rewards are not whole groups of k={k}")
    if judged is not None and len(judged) != len(rewards):
        raise ValueError(f"judged has {len(judged)} entries for {len(rewards)} rewards")
    pairs = []
    for start in range(0, len(rewards), k):
        rows = [r for r in range(start, start + k) if judged is None or judged[r]]
        if len(rows) < 2:
            continue
        if not all(math.isfinite(rewards[r]) for r in rows):
            raise ValueError(f"a judged reward of rows {start}..{start + k - 1} is not finite")
        best = max(rows, key=lambda r: (rewards[r], -r))
        worst = min(rows, key=lambda r: (rewards[r], r))
        if rewards[best] != rewards[worst]:
            pairs.append((best, worst))
    return pairs
