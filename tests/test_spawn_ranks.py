"""The bounded rank launcher the two-process tests use (``helpers.spawn_ranks``): a rank stuck after its
result is written no longer holds the stage, and a rank that never writes one fails the test by number."""

from __future__ import annotations

import time

import pytest
from helpers import spawn_ranks

pytestmark = pytest.mark.multiprocess  # spawns processes: make test-multiprocess


def _write_then(rank: int, out: str, hang_rank: int, write: bool) -> None:
    if write or rank != hang_rank:
        with open(f"{out}/rank{rank}.txt", "w") as f:
            f.write(str(rank))
    if rank == hang_rank:
        time.sleep(600)  # as a rank asleep at interpreter exit


def _raise(rank: int, out: str) -> None:
    raise ValueError(f"rank {rank} broke")


def test_a_rank_stuck_after_writing_its_result_is_reaped_and_the_results_stand(tmp_path):
    results = [tmp_path / f"rank{r}.txt" for r in (0, 1)]
    start = time.monotonic()
    with pytest.warns(UserWarning, match=r"ranks \[1\] still alive 1 s after every result was written: reaped"):
        spawn_ranks(_write_then, (str(tmp_path), 1, True), results, timeout_s=120, exit_grace_s=1)
    assert time.monotonic() - start < 60
    assert [p.read_text() for p in results] == ["0", "1"]


def test_a_rank_that_writes_nothing_fails_by_number_within_the_timeout(tmp_path):
    results = [tmp_path / f"rank{r}.txt" for r in (0, 1)]
    with pytest.raises(AssertionError, match=r"ranks \[1\] wrote no result within 20 s"):
        spawn_ranks(_write_then, (str(tmp_path), 1, False), results, timeout_s=20, exit_grace_s=1)


def test_a_rank_that_raises_fails_with_its_error(tmp_path):
    import torch.multiprocessing as mp

    with pytest.raises(mp.ProcessRaisedException, match="rank 0 broke|rank 1 broke"):
        spawn_ranks(_raise, (str(tmp_path),), [tmp_path / "rank0.txt", tmp_path / "rank1.txt"], timeout_s=60)
