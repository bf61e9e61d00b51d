"""An infinite, resumable, deterministic stream of query batches.

Batch ``n`` is a pure function of ``(seed, n, queries)``: the stream walks per-epoch permutations
from ``numpy.random.default_rng([seed, epoch])``. Resuming therefore needs only one integer (the
cursor) and can neither skip nor repeat data (verl #7401).
"""

from __future__ import annotations

from collections.abc import Iterator

import lightning
import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from score_lightning.data.queries import Query, load_queries


def _identity(batch: dict) -> dict:
    """Batches are built by the dataset; the default collate would only copy them."""
    return batch


def epoch_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """The query order for one epoch."""
    return np.random.default_rng([seed, epoch]).permutation(n)


class QueryStream(IterableDataset):
    """Yields ready batches ``{"id", "prompt", "cursor"}`` forever, starting at batch ``start``."""

    def __init__(self, queries: list[Query], batch_size: int, seed: int, start: int = 0,
                 rank: int = 0, world_size: int = 1) -> None:
        super().__init__()
        if batch_size % world_size:
            raise ValueError(
                f"data.batch_size={batch_size} is the global batch and must be divisible by the "
                f"number of data-parallel processes ({world_size})"
            )
        self.queries, self.batch_size, self.seed, self.start = queries, batch_size, seed, start
        self.rank, self.world_size = rank, world_size

    def batch(self, n: int) -> dict:
        """Batch number ``n`` (0-based): items ``n*B .. (n+1)*B-1`` of the concatenated epochs."""
        size, bsz = len(self.queries), self.batch_size
        items: list[Query] = []
        pos = n * bsz
        perm_epoch, perm = -1, None
        while len(items) < bsz:
            epoch, offset = divmod(pos, size)
            if epoch != perm_epoch:
                perm_epoch, perm = epoch, epoch_permutation(self.seed, epoch, size)
            take = min(bsz - len(items), size - offset)
            items.extend(self.queries[int(i)] for i in perm[offset:offset + take])
            pos += take
        # every rank walks the same global stream and keeps its own contiguous slice of batch n
        per_rank = bsz // self.world_size
        items = items[self.rank * per_rank:(self.rank + 1) * per_rank]
        return {"id": [q.id for q in items], "prompt": [q.prompt for q in items], "cursor": n + 1}

    def __iter__(self) -> Iterator[dict]:
        info = torch.utils.data.get_worker_info()
        if info is not None and info.num_workers > 1:
            # Each worker would replay the same stream; the batches are cheap, so refuse instead.
            raise RuntimeError("QueryStream is deterministic and cheap; use data.num_workers <= 1")
        n = self.start
        while True:
            yield self.batch(n)
            n += 1


class QueryDataModule(lightning.LightningDataModule):
    """Serves the query stream; ``set_start_cursor`` makes a resumed run continue where it stopped."""

    def __init__(self, queries_path: str | None = None, batch_size: int = 2, seed: int = 0,
                 num_workers: int = 0, split: str | None = "train") -> None:
        super().__init__()
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"data.batch_size must be a positive integer, got {batch_size!r}")
        self.queries_path = queries_path
        self.split = split  # "train": never the held-out queries of a file that marks a split
        self.batch_size = batch_size
        self.seed = seed
        self.num_workers = num_workers
        self.start_cursor = 0
        self._queries: list[Query] | None = None

    @property
    def queries(self) -> list[Query]:
        if self._queries is None:
            queries = load_queries(self.queries_path, self.split)
            if self.batch_size > len(queries):
                raise ValueError(
                    f"data.batch_size must be between 1 and the number of queries ({len(queries)} in "
                    f"{self.queries_path or 'the embedded query set'}), got {self.batch_size!r}"
                )
            self._queries = queries
        return self._queries

    def setup(self, stage: str | None = None) -> None:
        _ = self.queries  # validate early, before any rollout work

    def set_start_cursor(self, cursor: int) -> None:
        """Resume: the next loader serves batch number ``cursor`` (the last batch's ``cursor``)."""
        if cursor < 0:
            raise ValueError(f"cursor must be >= 0, got {cursor}")
        self.start_cursor = int(cursor)

    def dataset(self) -> QueryStream:
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        return QueryStream(self.queries, self.batch_size, self.seed, self.start_cursor, rank, world)

    def train_dataloader(self) -> DataLoader:
        if self.num_workers > 1:
            raise ValueError(f"data.num_workers must be 0 or 1 for the query stream, got {self.num_workers}")
        return DataLoader(self.dataset(), batch_size=None, num_workers=self.num_workers, collate_fn=_identity)
