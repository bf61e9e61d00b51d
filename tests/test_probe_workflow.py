"""The cold-start probe rolls a workflow policy out as its run will: ``solver.agent=mams`` through MaMs's search,
state and report roles. Probed as a ReAct loop it was never taught, MaMs's packaged cold start read an answer
validity of 0 however well it had learned its own workflow."""

from __future__ import annotations

import torch

from helpers import compose


def test_the_mams_cold_start_is_probed_through_its_own_roles(tiny_ckpt, corpus_file, cache_dir, bm25, tmp_path):
    from score_lightning.policy.models import load_policy, load_tokenizer
    from score_lightning.sft.probe import probe_policy
    from score_lightning.sft.run import run_sft

    cfg = compose(["experiment=mams_tiny", f"paths.cache_dir={cache_dir}", f"paths.output_dir={tmp_path}",
                   "threads.num=1"])
    path = run_sft(cfg, str(tiny_ckpt))  # the packaged MaMs cold start, installed (its key matches)
    tok = load_tokenizer(path)
    torch.manual_seed(0)
    rates = probe_policy(load_policy(path), tok, bm25, cfg, n_rubric=0, n_solver=8, seed=0, n_scoring=0)
    assert rates["probe/answer_valid_rate"] > 0, rates
    assert rates["probe/tool_calls_mean"] >= 1  # the search role searched
