"""The optimisers of a SCORE run: the solver's AdamW, the evaluator's own, and their warmup.

**The evaluator's own step** (``evaluator.optimizer: own``, the default). The paper analyses the
alternating updates as descent on L_s + alpha L_e with alpha = eta_e / eta_s. Under Adam a constant
factor on a loss is normalised away (the first step is ~lr * sign(g) whatever the gradient's
scale), so alpha cannot live in the REINFORCE loss. It is the evaluator's learning rate instead:
an AdamW of lr ``alpha * optim.lr`` with moments of its own, so evaluator gradients never enter the
solver's moments either. With a shared actor both optimisers hold the same parameters; that costs
a second pair of Adam moments (8 bytes per trained parameter, lazily allocated at the first
evaluator step), and only the solver's optimiser applies weight decay to them, once per step.
``evaluator.optimizer: shared`` is the memory-saving alternative: the REINFORCE step goes through
the solver's AdamW state and alpha weights the loss (what Adam largely cancels).

**Warmup.** ``optim.warmup_steps`` SCORE steps from ``optim.warmup_start_ratio * lr`` to ``lr`` (verl's
constant-with-warmup schedule is ``warmup_start_ratio=0``: the first step does not move the weights). Every
scheduler steps once per SCORE step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from score_lightning.config.schema import ActorConfig, EvaluatorConfig, OptimConfig


@dataclass
class Optimizers:
    """What ``configure_optimizers`` returns, and which optimiser each phase steps (an index, or None)."""

    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    schedulers: list[torch.optim.lr_scheduler.LRScheduler] = field(default_factory=list)
    solver: int | None = None
    evaluator: int | None = None


def warmup_factor(optim: "OptimConfig") -> Callable[[int], float]:
    """The lr multiplier at SCORE step ``s`` (see the module docstring)."""
    warm, start = int(optim.warmup_steps), float(optim.warmup_start_ratio)
    return lambda s: 1.0 if warm <= 0 or s >= warm else start + (1.0 - start) * s / warm


def loss_alpha(evaluator: "EvaluatorConfig", actor: "ActorConfig") -> float:
    """The factor the REINFORCE loss carries: 1 when alpha is the evaluator's lr ratio (``evaluator.optimizer=own``,
    or a separate evaluator model with its own optimiser), else alpha."""
    own = evaluator.optimizer == "own" or not bool(actor.shared)
    return 1.0 if own else float(evaluator.alpha)


def _trainable(model: nn.Module | None) -> list[nn.Parameter]:
    return [] if model is None else [p for p in model.parameters() if p.requires_grad]


def build_optimizers(optim: "OptimConfig", evaluator: "EvaluatorConfig", policy: nn.Module,
                     evaluator_policy: nn.Module | None = None) -> Optimizers:
    """The solver's AdamW over the policy and, when the evaluator trains, its own (see the module docstring).

    ``evaluator_policy`` is the separate evaluator model (``actor.shared=false``), else ``None``.
    """
    o = optim
    factor = warmup_factor(o)
    out = Optimizers()

    def add(params: list[nn.Parameter], lr: float, weight_decay: float) -> int:
        opt = torch.optim.AdamW(params, lr=lr, betas=tuple(o.betas), weight_decay=weight_decay, eps=float(o.eps))
        out.optimizers.append(opt)
        out.schedulers.append(torch.optim.lr_scheduler.LambdaLR(opt, factor))
        return len(out.optimizers) - 1

    lr, wd = float(o.lr), float(o.weight_decay)
    solver = _trainable(policy)
    if solver:
        out.solver = add(solver, lr, wd)
    if not bool(evaluator.enabled):
        return out
    alpha = float(evaluator.alpha)
    if evaluator_policy is not None:  # a separate model: its own parameters, decay and moments
        params = _trainable(evaluator_policy)
        if params:
            out.evaluator = add(params, alpha * lr, wd)
    elif evaluator.optimizer == "own" and solver:
        out.evaluator = add(solver, alpha * lr, 0.0)  # the same weights: the solver's optimiser decays them
    else:
        out.evaluator = out.solver  # shared state: alpha weights the loss (loss_alpha)
    return out
