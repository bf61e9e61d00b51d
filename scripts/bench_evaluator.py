#!/usr/bin/env python
"""What does an evaluator know? Pairwise accuracy, AUC and Cohen's d on held-out pairs with a known better side.

    python scripts/bench_evaluator.py --seed 1                                   # tiny_score's own cold start
    python scripts/bench_evaluator.py --seed 1 experiment=smol_score             # any recipe's evaluator
    python scripts/bench_evaluator.py --pair-set logs/bench_evaluator/seed1-.../pairs.jsonl experiment=given_tiny
    python scripts/bench_evaluator.py --pair-set FILE --judge-base-url http://HOST:8000/v1 --judge-model M

**Pairs** (held-out queries: the query file's ``split: heldout`` lines, the embedded set's 20; ``--split train``
builds a set on training queries instead, for the in-run probe ``callbacks.evaluator_pairs``). The solver
(the recipe's own cold start, installed or trained as ``train.py`` does, or ``--model``) writes ``--samples``
reports per query at the recipe's solver temperature and budgets, under the harness's fallback rubric. From them
(:mod:`score_lightning.evaluation.pair_build`):

* **degraded pairs**: each grounded-valid report against each of its own minimal edits: ``no_citation``
  (citations dropped), ``unretrieved_citation`` (a cited id swapped for a corpus id its searches never
  returned), ``truncated`` (cut short), ``off_topic`` (another held-out query's report) and ``empty`` (no
  report); at most ``--pairs``, whole reports with all their edits, one query at a time;
* **valid pairs**: two grounded-valid reports of one query whose ``item_recall`` over the query's evidence
  items (``reward.items_path``, default the embedded items) differs by at least one item; at most ``--valid-pairs``.

The set is written as JSONL with a manifest holding its sha256 digest (:mod:`score_lightning.evaluation.pair_set`);
``--pair-set FILE`` scores a stored set again (nothing sampled), refusing one whose bytes changed.

**Scores** (:mod:`score_lightning.evaluation.pair_scoring`): the recipe's evaluator scores both sides of every pair
the way the step does (its rubric source: a sampled rubric for ``rubric=score``, the fallback for
``static_rubric``, the initial items for ``evolving``, the file's for ``given``; ``evaluator.scoring``,
``show_retrieved``, ``constrained_scoring``, ``score_readout``), or ``--judge-base-url/--judge-model`` an external
OpenAI-compatible judge does, with the same scoring messages and parser. A side's score is Σ_j w_j s_j as the
reward reads it. A side no complete evaluation reached (for the judge: a request that failed) is counted and its
pairs are left out, never scored 0.

**Metrics** (:mod:`score_lightning.evaluation.pair_metrics`), per edit kind, over all degraded pairs, over the
valid pairs and over all pairs: pairwise accuracy (a tie counts 0.5), the ROC AUC of better against worse sides
over the pooled scores, and Cohen's d (better minus worse over the pooled SD), each with a 95% query-bootstrap
interval (queries resampled, fixed seed). Results JSON beside the pair set. The last line::

    pairs=N pair_acc=x pair_acc_ci=[lo,hi] valid_pairs=M valid_pair_acc=y valid_pair_acc_ci=[lo,hi] auc=z cohen_d=d

N and ``pair_acc`` count the scored degraded pairs, M and ``valid_pair_acc`` the scored valid pairs; ``auc`` and
``cohen_d`` are over all scored pairs, degraded and valid together.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))


def _args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1, help="seeds the sampling, the pair choice and the scoring")
    ap.add_argument("--pairs", type=int, default=150, help="at most this many degraded pairs")
    ap.add_argument("--valid-pairs", type=int, default=None, help="at most this many valid pairs (default: --pairs)")
    ap.add_argument("--samples", type=int, default=8, help="solver rollouts per held-out query")
    ap.add_argument("--queries", type=int, default=0, help="only the first N queries of the split (0: all)")
    ap.add_argument("--split", choices=("heldout", "train"), default="heldout",
                    help="heldout (the benchmark) or train: a pair set on training queries, for the in-run probe "
                         "callbacks.evaluator_pairs (never a held-out measurement)")
    ap.add_argument("--model", default=None,
                    help="checkpoint directory or model preset; default: the recipe's own cold start")
    ap.add_argument("--pair-set", default=None, help="score this stored pair set (nothing is sampled)")
    ap.add_argument("--out", default=None, help="folder for the pair set and results (default: "
                    "logs/bench_evaluator/seed<S>-<time>/, or the stored pair set's folder)")
    ap.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples of the intervals")
    ap.add_argument("--judge-base-url", default=None, help="an OpenAI-compatible judge instead of the evaluator")
    ap.add_argument("--judge-model", default=None)
    ap.add_argument("--judge-api-key-env", default="OPENAI_API_KEY", help="environment variable holding its key")
    ap.add_argument("--judge-concurrency", type=int, default=4, help="judge requests in flight at most")
    ap.add_argument("--judge-timeout-s", type=float, default=120.0)
    ap.add_argument("--judge-max-retries", type=int, default=2)
    ap.add_argument("--judge-max-tokens", type=int, default=2048)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides (default experiment=tiny_score)")
    args = ap.parse_args(argv)
    if bool(args.judge_base_url) != bool(args.judge_model):
        ap.error("--judge-base-url and --judge-model go together")
    return args


class _Policy:
    """The recipe's model, loaded on first use: tokenizer, engine and where it came from."""

    def __init__(self, cfg, model_arg):
        self.cfg, self.model_arg = cfg, model_arg
        self.path = self.tok = self.engine = None

    def load(self):
        if self.engine is not None:
            return self
        from probe_scoring import recipe_cold_start

        from score_lightning.launch.training import resolve_model_arg
        from score_lightning.policy.models import load_policy, load_tokenizer

        cfg = self.cfg
        own = self.model_arg is None
        self.path = recipe_cold_start(cfg) if own else resolve_model_arg(self.model_arg, cfg.paths.cache_dir)
        print(f"model: {self.path}" + (" (the recipe's own cold start)" if own else ""), flush=True)
        self.tok = load_tokenizer(self.path, chat_template=cfg.model.get("chat_template"))
        if cfg.rollout.engine == "scripted":
            from hydra.utils import instantiate

            from score_lightning.rollout.scripted import ScriptedEngine

            self.engine = ScriptedEngine(self.tok, instantiate(cfg.rollout.responder))
            return self
        from score_lightning.rollout.hf_engine import HFEngine, fast_forward_options

        if cfg.rollout.engine != "hf":
            print(f"rollout={cfg.rollout.engine}: the bench generates with the HF engine", flush=True)
        model = load_policy(self.path, str(cfg.model.get("dtype", "float32"))).eval()
        self.engine = HFEngine(lambda: model, self.tok.pad_token_id, self.tok.eos_token_id, self.tok,
                               int(cfg.rollout.max_batch_size), **fast_forward_options(cfg.rollout))
        return self


def _queries(cfg, limit: int, split: str = "heldout") -> list[tuple[str, str]]:
    from score_lightning.data.queries import load_queries

    queries = [(q.id, q.prompt) for q in load_queries(cfg.data.get("queries_path"), split)]
    if not queries:
        raise SystemExit(f"error: the query file has no {split} queries (lines with \"split\": \"{split}\")")
    return queries[:limit] if limit > 0 else queries


def _items(cfg, queries):
    """The evidence items of each held-out query (matched by id and prompt), and the items file's digest."""
    from score_lightning.data.items import EMBEDDED_ITEMS_PATH, file_digest, load_items

    path = cfg.reward.get("items_path") or EMBEDDED_ITEMS_PATH
    by_id = load_items(path)
    out = {qid: by_id[qid].items for qid, prompt in queries if qid in by_id and by_id[qid].prompt == prompt}
    return out, {"items_path": str(path), "items_digest": file_digest(path), "queries_with_items": len(out)}


def build(args, cfg, policy, state, retriever, out_dir: Path):
    """Sample, pair, and store; returns the pairs, the pair-set path and its digest."""
    import torch

    from score_lightning.evaluation.pair_build import build_pairs
    from score_lightning.evaluation.pair_scoring import sample_reports
    from score_lightning.evaluation.pair_set import write_pair_set
    from score_lightning.step.rollouts import rollout_settings

    queries = _queries(cfg, args.queries, args.split)
    items, items_meta = _items(cfg, queries)
    policy.load()
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    reward = cfg.reward
    samples = sample_reports(policy.engine, policy.tok, retriever, queries, state,
                             rollout_settings(cfg.solver, cfg.evaluator), reward, args.samples,
                             int(cfg.rollout.max_batch_size))
    known = [d.id for d in (getattr(retriever, "docs", None) or [])]
    pairs, stats = build_pairs(samples, items, random.Random(args.seed), max_degraded=args.pairs,
                               max_valid=args.pairs if args.valid_pairs is None else args.valid_pairs,
                               known_ids=known, min_chars=reward.min_answer_chars)
    print(f"sampled {len(samples)} reports on {len(queries)} {args.split} queries in {time.perf_counter() - t0:.0f}s: "
          f"{stats.grounded_valid} grounded-valid ({stats.distinct_valid} distinct); edits skipped {stats.skipped}",
          flush=True)
    path = out_dir / "pairs.jsonl"
    meta = {"seed": args.seed, "samples": args.samples, "max_pairs": args.pairs, "max_valid_pairs": args.valid_pairs,
            "model": str(policy.path), "recipe_model": args.model is None, "overrides": list(args.overrides),
            "solver_temperature": float(cfg.solver.temperature), "split": args.split,
            f"{args.split}_queries": len(queries),
            "reports": len(samples), "grounded_valid": stats.grounded_valid, "distinct_valid": stats.distinct_valid,
            "skipped_edits": stats.skipped, "created": time.strftime("%Y-%m-%dT%H:%M:%S"), **items_meta}
    return pairs, path, write_pair_set(path, pairs, meta)


def score(args, cfg, policy, state, retriever, pairs):
    """Both sides of every pair, by the recipe's evaluator or the judge; returns (outcome, evaluator record)."""
    import torch
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from score_lightning.evaluation import pair_scoring as S
    from score_lightning.step.rollouts import rollout_settings

    settings = rollout_settings(cfg.solver, cfg.evaluator)
    source = instantiate(cfg.rubric, _convert_="all")
    qids = sorted({(p.query_id, p.query) for p in pairs})
    record = {"rubric": str(cfg.rubric.get("_target_")), "scoring": settings.scoring_protocol,
              "show_retrieved": settings.show_retrieved, "show_passages": settings.show_passages}
    torch.manual_seed(args.seed + 1_000_003)  # the scoring's own stream: a stored set rescored samples the same
    if args.judge_base_url:
        from score_lightning.clients.chat import ChatClient

        if settings.show_passages:
            raise SystemExit("evaluator.show_passages with --judge-base-url: this script's judge path shows reports "
                             "without their passages; run without evaluator.show_passages (the training step's "
                             "external judge, judge=openai, does show them)")

        rubrics, how = S.judge_rubrics(source, state, [q for q, _ in qids])
        client = ChatClient(args.judge_base_url, args.judge_model, os.environ.get(args.judge_api_key_env or ""),
                            timeout_s=args.judge_timeout_s, max_retries=args.judge_max_retries,
                            max_tokens=args.judge_max_tokens)
        outcome = S.judge_scores(client, pairs, rubrics, state, settings.scoring_protocol, settings.show_retrieved,
                                 args.judge_concurrency)
        record.update(kind="judge", base_url=args.judge_base_url, model=args.judge_model, rubrics=how,
                      requests=client.num_requests)
        return outcome, record
    from score_lightning.harness.scheduler import DimensionScheduler
    from score_lightning.step.rubric_source import RubricContext

    policy.load()
    sched = DimensionScheduler(list(state.dimension_pool),
                               **OmegaConf.to_container(cfg.harness.get("scheduler") or {}, resolve=True))
    ctx = RubricContext(policy.engine, policy.tok, retriever, state, sched, int(cfg.evaluator.max_prompt_tokens),
                        float(cfg.evaluator.temperature))
    rubrics, fallback = S.query_rubrics(source, ctx, qids, int(cfg.data.batch_size), int(cfg.solver.topk))
    outcome = S.evaluator_scores(policy.engine, policy.tok, retriever, pairs, rubrics, state, settings,
                                 int(cfg.rollout.max_batch_size))
    record.update(kind="evaluator", model=str(policy.path), readout=settings.score_readout,
                  constrained=settings.constrained_scoring, rubric_fallback=fallback, rubrics_asked=len(rubrics))
    return outcome, record


def main(argv=None) -> int:
    args = _args(argv)
    from omegaconf import OmegaConf
    from probe_scoring import _compose

    from score_lightning.evaluation.pair_build import EDIT_KINDS
    from score_lightning.evaluation.pair_metrics import last_line, summarise_kinds, table
    from score_lightning.evaluation.pair_set import read_pair_set
    from score_lightning.harness.state import HarnessState
    from score_lightning.launch.threads import apply_threads
    from score_lightning.launch.cpu_memory import set_malloc_mmap_threshold
    from score_lightning.retrieval.from_config import retriever_from_config

    cfg = _compose(["experiment=tiny_score", *args.overrides])
    apply_threads(cfg)
    set_malloc_mmap_threshold(cfg.trainer.get("malloc_mmap_threshold_mb"))
    t0 = time.perf_counter()
    state = HarnessState.from_dict(OmegaConf.to_container(cfg.harness.initial_state, resolve=True))
    retriever = retriever_from_config(cfg.retriever, cfg.paths.cache_dir)
    policy = _Policy(cfg, args.model)
    if args.pair_set:
        pairs, manifest = read_pair_set(args.pair_set)
        path, digest = Path(args.pair_set), manifest["digest"]
        out_dir = Path(args.out) if args.out else path.parent
    else:
        out_dir = Path(args.out) if args.out else \
            Path(str(cfg.paths.log_dir)) / "bench_evaluator" / f"seed{args.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
        pairs, path, digest = build(args, cfg, policy, state, retriever, out_dir)
    print(f"pair_set={path} digest={digest} pairs={len(pairs)}", flush=True)
    t1 = time.perf_counter()
    outcome, record = score(args, cfg, policy, state, retriever, pairs)
    rows = [(p.query_id, p.kind, s[p.better], s[p.worse]) for p, s in zip(pairs, outcome.scores) if None not in s]
    summary = summarise_kinds(rows, EDIT_KINDS, args.resamples)
    print(f"scored in {time.perf_counter() - t1:.0f}s: {outcome.judgements} judgements, {outcome.failed} failed "
          f"{dict(outcome.errors)}; pairs left out {len(pairs) - len(rows)} of {len(pairs)}"
          + (f"; rubrics fell back {record['rubric_fallback']}/{record['rubrics_asked']}"
             if "rubric_fallback" in record else ""))
    print("\n".join(table(summary)))
    line = last_line(summary)
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = "judge" if args.judge_base_url else "evaluator"
    result = {"pair_set": str(path), "pair_set_digest": digest, "seed": args.seed, "overrides": list(args.overrides),
              "evaluator": record, "judgements": outcome.judgements, "failed": outcome.failed,
              "errors": dict(outcome.errors), "pairs_left_out": len(pairs) - len(rows),
              "summary": {k: v.to_dict() for k, v in summary.items()}, "wall_s": round(time.perf_counter() - t0, 1),
              "scores": [{"query_id": p.query_id, "kind": p.kind, "better": s[p.better], "worse": s[p.worse]}
                         for p, s in zip(pairs, outcome.scores)], "last_line": line}
    res_path = out_dir / f"results-{tag}-seed{args.seed}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    res_path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"results: {res_path} (wall {time.perf_counter() - t0:.0f}s)")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
