"""RLER's ``rubric/*`` scalars are the whole batch's, not rank 0's share (issue 69).

Two real processes over a gloo group on loopback each hold their own queries' buffers, as data-parallel ranks do;
both must log the pooled values computed by hand below.
"""

from __future__ import annotations

import json
import socket

import pytest

pytestmark = pytest.mark.multiprocess  # two training processes: make test-multiprocess
import torch

#: per rank: (query id, 2 reports' scores on its 3 items); q4's writer fails, so it has no items to score
SCORES = {
    0: {"q1": [[1.0, 0.5, 0.0], [0.0, 0.5, 0.4]]},  # spreads 0.5, 0, 0.2: keeps 2, removes 1
    1: {"q2": [[1.0, 0.0, 0.6], [0.0, 0.2, 0.0]],  # spreads 0.5, 0.1, 0.3: keeps the widest 2, removes 1
        "q3": [[0.3, 0.3, 0.8], [0.3, 0.3, 0.0]],  # spreads 0, 0, 0.4: keeps 1, removes 2
        "q4": None},
}


def _rank_main(rank: int, port: int, tokenizer_path: str, out: str) -> None:
    import torch.distributed as dist

    from score_lightning.harness.scheduler import DimensionScheduler
    from score_lightning.harness.state import HarnessState
    from score_lightning.policy.models import load_tokenizer
    from score_lightning.retrieval.base import SearchHit
    from score_lightning.rollout.scripted import ProtocolResponder, ScriptedEngine
    from score_lightning.step.rubric_source import RubricContext
    from score_lightning.methods.rler.evolving import EvolvingRubrics

    class OneHit:
        def search(self, queries, topk):
            return [[SearchHit("doc.a", '"doc.a"\npassage about a', 1.0)] for _ in queries]

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    tokenizer, script = load_tokenizer(tokenizer_path), ProtocolResponder()
    state = HarnessState()
    engine = ScriptedEngine(tokenizer, lambda req: "no items" if "q4" in req.query else script(req))
    ctx = RubricContext(engine, tokenizer, OneHit(), state, DimensionScheduler(list(state.dimension_pool)), 1024, 0.8)
    src = EvolvingRubrics(max_items=2, init_items=3, new_items=2)
    qids = list(SCORES[rank])
    queries = [f"how does json.dumps work for {q}?" for q in qids]
    step = src.step_rubrics(ctx, queries, qids, [["doc.a"]] * len(qids))
    scores = [torch.tensor(SCORES[rank][q]) if SCORES[rank][q] else None for q in qids]
    observed = src.observe(ctx, queries, qids, scores, [["best", "worst"]] * len(qids), [[1.0, 0.0]] * len(qids))
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump({"step": step.stats, "observe": observed}, f)
    dist.destroy_process_group()


def test_rler_rubric_scalars_are_pooled_over_two_ranks(tmp_path, tiny_ckpt):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank_main, args=(port, str(tiny_ckpt), str(tmp_path)), nprocs=2, join=True)
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert got[0] == got[1]  # every rank logs the same, pooled value
    step, observed = got[0]["step"], got[0]["observe"]
    assert step["rubric/items_added"] == 9.0  # 3 items for q1, q2, q3; q4's reply has none
    assert step["rubric/write_fail_rate"] == pytest.approx(1 / 4)  # 1 failed write of 4 (rank 1 alone: 1/3)
    assert observed["rubric/items_removed"] == 4.0  # 1 + 1 + 2
    assert observed["rubric/buffer_size"] == pytest.approx((2 + 2 + 1 + 0) / 4)  # rank 0 alone: 2
    assert observed["rubric/item_std_mean"] == pytest.approx((0.5 + 0.2 + 0.5 + 0.3 + 0.4) / 5)  # rank 0: 0.35
