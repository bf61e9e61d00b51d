"""What the solver update trains: trajectories as token rows, and per-token advantages on those rows.

A ReAct trajectory is one row. A MaMs trajectory is one row per role call (its segments), each
with its own bounded prompt; all rows of a trajectory carry its GRPO advantage. GRPO groups and
the strided mini-batches still count *queries* (K trajectories each): a mini-batch trains every row
of every trajectory of its queries, so the global token mean and the 1-vs-N-process equivalence
are those of the ReAct path.

Step-level rewards (``reward.step=rubric``) add a bonus to the tokens of the turn that issued a
search: A_token = A_traj + bonus there, A_traj elsewhere (:class:`TokenBonus`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from score_lightning.step.batching import TokenBatch
from score_lightning.rollout.trajectory import Trajectory


@dataclass(frozen=True)
class TokenBonus:
    """``value`` added to the advantage of response tokens ``start .. end-1`` of the trajectory's row ``row``."""

    row: int
    start: int
    end: int
    value: float


@dataclass
class TrainingRows:
    """The rows of a list of trajectories: ``rows[r]`` belongs to trajectory ``owner[r]``."""

    rows: list
    owner: list[int]
    offsets: list[int]  # trajectory i's rows are offsets[i] .. offsets[i+1]-1

    def of(self, trajectories: Sequence[int]) -> list[int]:
        """Row indices of the given trajectories, in order."""
        return [r for i in trajectories for r in range(self.offsets[i], self.offsets[i + 1])]


def training_rows(trajs: Sequence[Trajectory]) -> TrainingRows:
    """Every trajectory's rows (itself, or its MaMs segments), trajectory-major."""
    rows, owner, offsets = [], [], [0]
    for i, t in enumerate(trajs):
        own = t.rows()
        rows.extend(own)
        owner.extend([i] * len(own))
        offsets.append(len(rows))
    return TrainingRows(rows, owner, offsets)


def token_advantages(batch: TokenBatch, tr: TrainingRows, adv: Tensor,
                     bonus: Sequence[Sequence[TokenBonus]]) -> Tensor:
    """``[R, L-1]`` advantages in the batch layout: each row's trajectory advantage plus its step bonuses.

    Response token j of a row is scored at column ``len(prompt) - 1 + j`` (``build_token_batch``).
    Columns outside the response carry the trajectory advantage too; the loss mask zeroes them.
    """
    dense = adv[torch.as_tensor(tr.owner, dtype=torch.long)].float().unsqueeze(1).expand_as(batch.loss_mask).clone()
    for i, items in enumerate(bonus):
        for b in items:
            r = tr.offsets[i] + b.row
            base = len(tr.rows[r].prompt_ids) - 1
            dense[r, base + b.start:base + b.end] += float(b.value)
    return dense
