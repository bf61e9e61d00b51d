"""DR-rubric's ``rubric/*`` scalars are the whole batch's, not rank 0's share (issue 69).

Two real processes over a gloo group on loopback each research and write their own queries' rubrics, as
data-parallel ranks do; both must log the pooled values computed by hand below.
"""

from __future__ import annotations

import json
import socket

import pytest
from helpers import spawn_ranks

pytestmark = pytest.mark.multiprocess  # two training processes: make test-multiprocess

#: per rank: its queries, its writer's max_items, and whether its retriever is down
RANKS = {0: (["q1"], 2, False), 1: (["q2", "q3"], 6, True)}


def _rank_main(rank: int, port: int, tokenizer_path: str, out: str) -> None:
    import torch.distributed as dist

    from score_lightning.harness.scheduler import DimensionScheduler
    from score_lightning.harness.state import HarnessState
    from score_lightning.policy.models import load_tokenizer
    from score_lightning.retrieval.base import RetrievalError, SearchHit
    from score_lightning.rollout.scripted import ProtocolResponder, ScriptedEngine
    from score_lightning.step.rubric_source import RubricContext
    from score_lightning.methods.drrubric.dr_rubric import DeepResearchRubrics

    class Retriever:
        def __init__(self, down: bool):
            self.down = down

        def search(self, queries, topk):
            if self.down:
                raise RetrievalError("search backend unavailable")
            return [[SearchHit("doc.a", "json.dumps turns objects into JSON text", 1.0)] for _ in queries]

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    qids, max_items, down = RANKS[rank]
    tokenizer, script = load_tokenizer(tokenizer_path), ProtocolResponder()
    broken = lambda req: "<rubric_items></rubric_items>" if req.role == "distil" and "q3" in req.query else script(req)  # noqa: E731
    state = HarnessState()
    ctx = RubricContext(ScriptedEngine(tokenizer, broken), tokenizer, Retriever(down), state,
                        DimensionScheduler(list(state.dimension_pool)), 1024, 0.8)
    step = DeepResearchRubrics(max_items=max_items).step_rubrics(ctx, [f"how does json.dumps work for {q}?" for q in qids],
                                                                 qids, [[]] * len(qids))
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(step.stats, f)
    dist.destroy_process_group()


def test_drrubric_scalars_are_pooled_over_two_ranks(tmp_path, tiny_ckpt):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spawn_ranks(_rank_main, (port, str(tiny_ckpt), str(tmp_path)), [tmp_path / f"rank{r}.json" for r in (0, 1)])
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert got[0] == got[1]  # every rank logs the same, pooled value
    stats = got[0]
    # the scripted distillation gives 4 atomic items: q1 keeps 2 (max_items=2), q2 all 4, q3's reply has none
    assert stats["rubric/iteration"] == 1.0
    assert stats["rubric/rewritten"] == 2.0 and stats["rubric/items_added"] == 6.0  # rank 0 alone: 1 and 2
    assert stats["rubric/write_fail_rate"] == pytest.approx(1 / 3)  # rank 0 alone: 0; rank 1 alone: 1/2
    assert stats["rubric/research_searches"] == 1.0 and stats["rubric/research_fail_rate"] == 0.0
    assert stats["rubric/research_retrieval_errors"] == 2.0  # both of rank 1's searches; rank 0 alone: 0
    assert stats["rubric/buffer_size"] == pytest.approx((2 + 4) / 2)  # rank 0 alone: 2
