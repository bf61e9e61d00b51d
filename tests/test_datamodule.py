"""The query stream: deterministic, infinite, resumable from a cursor, one full pass per epoch."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path

import pytest

from score_lightning.data.datamodule import QueryDataModule, QueryStream
from score_lightning.data.queries import load_queries


@pytest.fixture
def small_queries(tmp_path) -> Path:
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps({"id": f"s{i}", "prompt": f"prompt {i}?"}) + "\n" for i in range(7)))
    return path


def take(dm: QueryDataModule, n: int) -> list[dict]:
    return list(itertools.islice(iter(dm.train_dataloader()), n))


def flat_ids(batches: list[dict]) -> list[str]:
    return [i for b in batches for i in b["id"]]


def test_batches_have_the_contract_shape():
    dm = QueryDataModule(batch_size=3, seed=0)
    batches = take(dm, 4)
    prompts = {q.id: q.prompt for q in load_queries()}
    for n, b in enumerate(batches):
        assert set(b) == {"id", "prompt", "cursor"}
        assert b["cursor"] == n + 1
        assert len(b["id"]) == len(b["prompt"]) == 3
        assert all(isinstance(i, str) for i in b["id"])
        assert [prompts[i] for i in b["id"]] == b["prompt"]


def test_deterministic_and_seed_dependent(small_queries):
    a = take(QueryDataModule(str(small_queries), batch_size=3, seed=5), 10)
    b = take(QueryDataModule(str(small_queries), batch_size=3, seed=5), 10)
    c = take(QueryDataModule(str(small_queries), batch_size=3, seed=6), 10)
    assert a == b
    assert flat_ids(a) != flat_ids(c)
    # Batch n is a pure function of (seed, n, data): computed directly, out of order.
    stream = QueryStream(load_queries(small_queries), batch_size=3, seed=5)
    assert [stream.batch(n) for n in (9, 0, 4)] == [a[9], a[0], a[4]]


@pytest.mark.parametrize("batch_size", [1, 3, 7])
def test_every_query_once_per_epoch_and_reshuffled(small_queries, batch_size):
    n_items = 7 * 6
    batches = take(QueryDataModule(str(small_queries), batch_size=batch_size, seed=1),
                   n_items // batch_size)
    ids = flat_ids(batches)
    epochs = [ids[i:i + 7] for i in range(0, len(ids), 7)]
    assert len(epochs) == 6
    for epoch in epochs:
        assert sorted(epoch) == [f"s{i}" for i in range(7)]  # a permutation: no skips, no repeats
    assert len({tuple(e) for e in epochs}) > 1  # not the same order every epoch


def test_batches_straddle_epoch_boundaries(small_queries):
    # 7 queries, batch 3: batch 2 holds the last item of epoch 0 and two of epoch 1.
    ids = flat_ids(take(QueryDataModule(str(small_queries), batch_size=3, seed=2), 7))
    assert Counter(ids[:7]) == Counter(ids[7:14]) == Counter(f"s{i}" for i in range(7))


@pytest.mark.parametrize("cursor", [0, 1, 2, 5, 13])
def test_resume_from_cursor_serves_the_same_batches(small_queries, cursor):
    full = take(QueryDataModule(str(small_queries), batch_size=3, seed=9), 20)
    resumed_dm = QueryDataModule(str(small_queries), batch_size=3, seed=9)
    resumed_dm.set_start_cursor(cursor)
    resumed = take(resumed_dm, 20 - cursor)
    assert resumed == full[cursor:]
    # The cursor reported by a batch is exactly what a resumed run needs.
    if cursor:
        assert full[cursor - 1]["cursor"] == cursor


def test_resume_on_embedded_queries_across_epochs():
    full = take(QueryDataModule(batch_size=4, seed=0), 40)  # > 2 epochs of 60 queries
    dm = QueryDataModule(batch_size=4, seed=0)
    dm.set_start_cursor(full[31]["cursor"])
    assert take(dm, 8) == full[32:40]


def test_worker_process_serves_the_same_stream(small_queries):
    in_proc = take(QueryDataModule(str(small_queries), batch_size=2, seed=3), 5)
    dm = QueryDataModule(str(small_queries), batch_size=2, seed=3, num_workers=1)
    assert take(dm, 5) == in_proc


def test_bad_batch_size_is_a_clear_error(small_queries):
    with pytest.raises(ValueError, match=r"data\.batch_size.*got 0"):
        QueryDataModule(str(small_queries), batch_size=0)
    dm = QueryDataModule(str(small_queries), batch_size=8)
    with pytest.raises(ValueError, match=r"data\.batch_size.*\(7 in .*q\.jsonl\).*got 8"):
        dm.train_dataloader()
    with pytest.raises(ValueError, match="data.num_workers"):
        QueryDataModule(str(small_queries), batch_size=2, num_workers=2).train_dataloader()
    with pytest.raises(ValueError, match="cursor"):
        dm.set_start_cursor(-1)


def test_ranks_get_disjoint_slices_of_the_global_batch():
    from score_lightning.data.datamodule import QueryStream
    from score_lightning.data.queries import load_queries

    qs = load_queries(None)
    whole = QueryStream(qs, 4, seed=3).batch(5)
    halves = [QueryStream(qs, 4, seed=3, rank=r, world_size=2).batch(5) for r in range(2)]
    assert halves[0]["id"] + halves[1]["id"] == whole["id"]
    assert not set(halves[0]["id"]) & set(halves[1]["id"])
    with pytest.raises(ValueError, match="data.batch_size=3"):
        QueryStream(qs, 3, seed=0, world_size=2)
