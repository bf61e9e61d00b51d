#!/usr/bin/env python
"""What feeding a grammar's forced tokens in one forward saves in constrained scoring, by batch size and budget.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/bench_fast_forward.py --model .cache/sft/<smol_score cold start> \\
        --rows 2,16 --budgets off,16,64,256

One scoring turn (the final one: the ``<report_evaluations>`` block under the step's grammar) of ``--rows``
joint evaluations, each of K = ``solver.num_rollouts`` reports built from corpus passages with citations, for
a rubric of the harness's first ``k`` pool dimensions, through the experiment's chat template and caps
(``smol_score`` by default). Each setting runs in a fresh engine (no stored prefixes): ``off`` masks token by
token inside ``generate``; a number is ``rollout.grammar_fast_forward_tokens``. Decoding is greedy so every
setting must write the same ids (asserted: equal work), and the prefill, the same in all, is timed apart.
Printed: a Markdown table and a ``key=value`` line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))
import bench_common as bc  # noqa: E402


def _prompts(cfg, tok, rows: int):
    """``rows`` scoring prompts and their grammars: one query each, K corpus-passage reports, one rubric."""
    from omegaconf import OmegaConf

    from score_lightning.harness.state import HarnessState
    from score_lightning.paths import corpus_path
    from score_lightning.roles.prompts import scoring_messages
    from score_lightning.roles.rubric import Rubric
    from score_lightning.rollout.chat import encode_chat
    from score_lightning.rollout.constrained import ScoringConstraint, text_added_tokens

    state = HarnessState.from_dict(OmegaConf.to_container(cfg.harness.initial_state, resolve=True))
    k = int(state.dimension_constraints.k)
    dims = tuple(list(state.dimension_pool)[:k])
    rubric = Rubric(dims, tuple([1.0 / k] * k))
    K = int(cfg.solver.num_rollouts)
    with open(corpus_path(cfg)) as f:
        docs = [json.loads(line) for _, line in zip(range(rows * K), f)]
    caps = OmegaConf.to_container(cfg.evaluator.constrained_max_chars, resolve=True)
    pc = state.process_constraints
    grammar = ScoringConstraint(dims, K, pc.require_verification, pc.require_gap_analysis, text_added_tokens(tok),
                                caps).turn_grammar(False)
    prompts = []
    for r, query in enumerate(bc.bench_queries(rows)):
        reports = [" ".join(d["contents"].split()[:60]) + f" [{d['id']}]. Conclusion: see [{d['id']}]."
                   for d in docs[r * K:(r + 1) * K]]
        prompts.append(encode_chat(tok, scoring_messages(query, reports, rubric, state)))
    return prompts, (grammar,) * rows, rubric, K


def main(argv: list[str] | None = None) -> None:
    from score_lightning.policy.models import load_policy, load_tokenizer
    from score_lightning.roles.evaluation import parse_evaluation
    from score_lightning.rollout import fast_forward as FF
    from score_lightning.rollout import hf_engine
    from score_lightning.rollout.engine import SamplingParams
    from score_lightning.rollout.stops import TagStops

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a checkpoint directory or model preset (a cold start writes XML)")
    p.add_argument("--experiment", default="smol_score")
    p.add_argument("--rows", default="2,16", help="comma-separated batch sizes (evaluations per generate call)")
    p.add_argument("--budgets", default="off,16,64,256", help="off, or rollout.grammar_fast_forward_tokens values")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("overrides", nargs="*")
    a = p.parse_args(argv)
    bc.set_threads(a.threads)
    print(bc.machine_line(), flush=True)
    path = str(bc.checkpoint(a.model)) if not Path(a.model).is_dir() else a.model
    cfg = bc.compose([f"experiment={a.experiment}", f"model.name_or_path={path}", "sft.enabled=false", *a.overrides])
    bc.set_malloc(cfg)
    tok = load_tokenizer(path)
    model = load_policy(path, cfg.model.dtype).eval()
    forwards: list[int] = []
    real = FF.grammar_decode
    FF.grammar_decode = lambda *x, **kw: (lambda out: forwards.append(out.forwards) or out)(real(*x, **kw))
    prefills: list[float] = []
    real_prefill = hf_engine.prefill

    def timed_prefill(*x, **kw):
        t0 = time.perf_counter()
        out = real_prefill(*x, **kw)
        prefills.append(time.perf_counter() - t0)
        return out

    hf_engine.prefill = timed_prefill
    stops = TagStops(tok, ["</report_evaluations>"])
    results = []
    for rows in [int(x) for x in a.rows.split(",")]:
        prompts, grammars, rubric, K = _prompts(cfg, tok, rows)
        params = SamplingParams(int(cfg.evaluator.max_response_tokens), temperature=0.0,
                                stop_token_ids=stops.token_ids, stop_strings=stops.strings, grammars=grammars)
        reference = None
        for budget in a.budgets.split(","):
            engine = hf_engine.HFEngine(lambda: model, tok.pad_token_id, tok.eos_token_id, tok, max(rows, 1),
                                        fast_forward=budget != "off",
                                        fast_forward_tokens=64 if budget == "off" else int(budget))
            forwards.clear()
            prefills.clear()
            t0 = time.perf_counter()
            gens = engine.generate(prompts, params)
            wall = time.perf_counter() - t0
            ids = [g.token_ids for g in gens]
            if reference is None:
                reference = ids
            elif ids != reference:
                sys.exit(f"equal work failed: rows={rows} budget={budget} wrote other ids than "
                         f"{a.budgets.split(',')[0]}")
            valid = sum(parse_evaluation(tok.decode(x), rubric, K).valid for x in ids)
            n_tok = max(len(x) for x in ids)
            steps = forwards[0] if forwards else n_tok  # generate(): one forward per token of the longest row
            results.append(dict(rows=rows, budget=budget, wall=wall, prefill=sum(prefills), decode=wall - sum(prefills),
                                forwards=steps, tokens=sum(len(x) for x in ids), longest=n_tok, valid=valid))
            print(f"  rows={rows} budget={budget}: {wall:.1f} s (prefill {sum(prefills):.1f} s), {steps} forwards, "
                  f"{valid}/{rows} parsed", flush=True)
    print(f"\nOne greedy scoring turn per row, {a.experiment}, K = {K}, {len(rubric.dims)} dimensions, "
          f"<= {cfg.evaluator.max_response_tokens} tokens, threads={a.threads}; ids equal in every setting\n")
    print("| rows | fast-forward tokens | wall (s) | prefill (s) | decoding (s) | forwards | tokens (longest row) | "
          "decoding vs off | parsed |")
    print("|---|---|---|---|---|---|---|---|---|")
    off = {r["rows"]: r["decode"] for r in results if r["budget"] == "off"}
    for r in results:
        ratio = f"{r['decode'] / off[r['rows']]:.2f}" if r["rows"] in off else "–"
        print(f"| {r['rows']} | {r['budget']} | {r['wall']:.1f} | {r['prefill']:.1f} | {r['decode']:.1f} | "
              f"{r['forwards']} | {r['tokens']} ({r['longest']}) | {ratio} | {r['valid']}/{r['rows']} |")
    print(bc.summary_line(**{f"decode_s_rows{r['rows']}_{r['budget']}": r["decode"] for r in results},
                          equal_work="ok"))


if __name__ == "__main__":
    main()
