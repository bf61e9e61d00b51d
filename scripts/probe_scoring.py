#!/usr/bin/env python
"""Do the evaluator's scores carry signal? Sample step-like evaluations from a checkpoint and measure.

    python scripts/probe_scoring.py                                   # the packaged tiny_score cold start
    python scripts/probe_scoring.py --model logs/run/export --groups 40 evaluator.constrained_scoring=false
    python scripts/probe_scoring.py --model smollm2_135m --groups 40 experiment=smol_score   # a model preset
    python scripts/probe_scoring.py --scoring joint,pointwise          # both protocols on the same reports

Each group is one step of one query, sampled as RL samples it: a rubric from the rubric prompt (the
harness's initial state and the scheduler's first hints; the fallback rubric if it does not parse),
K solver rollouts with the retriever, and the evaluation of the K reports by the step's own scoring stage:
one evaluation of all K (``evaluator.scoring=joint``) or one per report (``pointwise``), constrained or
not as the config says. ``--scoring joint,pointwise`` scores the same groups under each protocol. Reported: how many evaluations and single reports parse, and whether the
rubric-weighted scores separate valid reports (a(r) = 1) from invalid ones (also split by why a
report is invalid: no report shown, no citation, ...), and reports whose citations were all retrieved
from the others. Each separation is a difference of means with a 95% bootstrap interval over groups
(a group's reports share one evaluation). The last line is ``key=value`` pairs. ``--demos N`` first fits
N fresh scoring demos teacher-forced (:mod:`score_lightning.sft.demo_fit`): whether the model gets the
scores right when the verification text is given, and whether it writes that text right.
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


def _gap(score: np.ndarray, side: np.ndarray, group: np.ndarray, rng: np.random.Generator) -> tuple[float, float, float]:
    """Mean score where ``side`` minus where not, and its 95% bootstrap interval over groups (NaN when a side
    is empty). Groups, not reports, are resampled: the K reports of one group share a query, a rubric and
    one evaluation, so their scores are not independent and a per-report bootstrap is too narrow."""
    if side.all() or not side.any():
        return float("nan"), float("nan"), float("nan")
    ids = np.unique(group)
    members = [np.flatnonzero(group == g) for g in ids]
    boots = []
    for _ in range(2000):
        pick = np.concatenate([members[i] for i in rng.integers(0, len(ids), len(ids))])
        s, y = score[pick], side[pick]
        if y.any() and not y.all():
            boots.append(s[y].mean() - s[~y].mean())
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return float(score[side].mean() - score[~side].mean()), float(lo), float(hi)


def main() -> int:
    from omegaconf import OmegaConf

    from score_lightning import protocol as P
    from score_lightning.data.queries import load_queries
    from score_lightning.harness.scheduler import DimensionScheduler
    from score_lightning.harness.state import HarnessState
    from score_lightning.policy.models import load_policy, load_tokenizer
    from score_lightning.retrieval.from_config import retriever_from_config
    from score_lightning.roles.prompts import rubric_messages
    from score_lightning.roles.rubric import fallback_rubric, parse_rubric
    from score_lightning.rollout.agent import TagStops
    from score_lightning.rollout.chat import encode_chat
    from score_lightning.rollout.engine import SamplingParams
    from score_lightning.rollout.hf_engine import HFEngine, fast_forward_options
    from score_lightning.sft.asset import ASSET_DIR
    from score_lightning.step.evaluations import group_evaluations
    from score_lightning.step.reward_assembly import RewardSettings, parse_answers
    from score_lightning.step.rollouts import RolloutSettings, scoring_rollouts, solver_rollouts

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ASSET_DIR),
                    help="checkpoint directory or model preset, e.g. smollm2_135m (default: the packaged cold start)")
    ap.add_argument("--groups", type=int, default=40, help="step-like groups (one query, K reports, one evaluation)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--demos", type=int, default=0,
                    help="also fit N fresh scoring demos teacher-forced, per report kind (score_lightning.sft.demo_fit)")
    ap.add_argument("--scoring", default=None,
                    help="comma list of protocols to score the same groups with (default: evaluator.scoring)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides (default experiment=tiny_score)")
    args = ap.parse_args()
    cfg = _compose(["experiment=tiny_score", *args.overrides])
    from score_lightning.policy.cpu_memory import set_malloc_mmap_threshold
    from score_lightning.launch.training import resolve_model_arg

    set_malloc_mmap_threshold(cfg.trainer.get("malloc_mmap_threshold_mb"))
    args.model = resolve_model_arg(args.model, cfg.paths.cache_dir)
    tok = load_tokenizer(args.model)
    model = load_policy(args.model, "float32").eval()
    retriever = retriever_from_config(cfg.retriever, cfg.paths.cache_dir)
    settings = RolloutSettings.from_cfg(cfg)
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    queries = [q.prompt for q in load_queries(cfg.data.get("queries_path"), cfg.data.get("split", "train"))]
    state = HarnessState.from_dict(OmegaConf.to_container(cfg.harness.initial_state, resolve=True))
    sched = DimensionScheduler(list(state.dimension_pool))
    engine = HFEngine(lambda: model, tok.pad_token_id, tok.eos_token_id, tok, int(cfg.rollout.max_batch_size),
                      **fast_forward_options(cfg.rollout))
    if args.demos > 0:
        from score_lightning.sft.context import DemoContext
        from score_lightning.sft.demo_fit import scoring_demo_fit
        from score_lightning.sft.demo_types import DemoBudgets

        ctx = DemoContext.create(tok, retriever, queries, DemoBudgets.from_cfg(cfg), state)
        for kind, f in scoring_demo_fit(model, tok, ctx, args.demos, seed=12345 + args.seed).items():
            print(f"demo fit {kind}: value target {f['target_value']:.2f} model {f['model_value']:.2f} "
                  f"(n={int(f['n_values'])}); verification start greedy-correct {f['verification_start_acc']:.2f} "
                  f"(n={int(f['n_verifications'])})")

    prompts = [encode_chat(tok, rubric_messages(rng.sample(queries, int(cfg.data.batch_size)), state, sched.required(),
                                                sched.avoided(), sched.explore())) for _ in range(args.groups)]
    stops = TagStops(tok, [P.DIMENSIONS_CLOSE])
    gens = engine.generate(prompts, SamplingParams(int(cfg.evaluator.max_rubric_tokens), float(cfg.evaluator.temperature),
                                                   stop_token_ids=stops.token_ids, stop_strings=stops.strings))
    parses = [parse_rubric(tok.decode(g.token_ids), state) for g in gens]
    rubrics = [p.rubric if p.valid else fallback_rubric(state) for p in parses]
    group_queries = [rng.choice(queries) for _ in range(args.groups)]
    # as many groups at a time as one generate call holds, as in an RL step: later turns then reuse the stored KV
    per = max(1, engine.max_batch_size // settings.num_rollouts)
    blocks = [slice(s, s + per) for s in range(0, args.groups, per)]
    trajs = [t for b in blocks for t in solver_rollouts(engine, tok, retriever, group_queries[b], rubrics[b], state,
                                                        settings)]
    answers = parse_answers(trajs, tok, RewardSettings.from_cfg(cfg))  # a(r) under the config's rules (reward.citations)
    K = settings.num_rollouts
    reports = [[a.answer if a.answer else None for a in answers[g * K:(g + 1) * K]] for g in range(args.groups)]  # as RL
    sources = [[t.retrieved_ids for t in trajs[g * K:(g + 1) * K]] for g in range(args.groups)]
    print(f"groups {args.groups} (K={K}), rubrics sampled valid {np.mean([p.valid for p in parses]):.2f}, "
          f"answers valid {np.mean([a.valid for a in answers]):.2f}, constrained scoring {settings.constrained_scoring}, "
          f"show_retrieved {settings.show_retrieved}")
    for protocol in (args.scoring or str(cfg.evaluator.scoring)).split(","):
        proto = replace(settings, scoring_protocol=protocol)
        # a group is one scoring row jointly and K pointwise: as many groups per generate call as rows fit
        rows = K if protocol == "pointwise" else 1
        step = max(1, engine.max_batch_size // rows)
        scoring = [t for s in range(0, args.groups, step)
                   for t in scoring_rollouts(engine, tok, retriever, group_queries[s:s + step], reports[s:s + step],
                                             rubrics[s:s + step], state, proto, sources[s:s + step])]
        evals = group_evaluations(scoring, rubrics, K, protocol, state.process_constraints, tok)
        _report(protocol, evals, rubrics, answers, trajs, K, np.random.default_rng(args.seed))
    return 0


def _report(protocol: str, evals, rubrics, answers, trajs, K: int, brng: np.random.Generator) -> None:
    """Separation of the rubric-weighted scores among reports whose scores parsed: valid vs invalid, and
    reports citing only retrieved ids vs the rest; a ``key=value`` line per protocol."""
    rows = []
    for g, ev in enumerate(evals):
        matrix = ev.parse.score_matrix(rubrics[g], K)
        for k in range(K):
            a, t = answers[g * K + k], trajs[g * K + k]
            cited_ok = bool(a.cited_ids) and all(c in t.retrieved_ids for c in a.cited_ids)
            if ev.report_valid(k + 1):
                rows.append((a.valid, cited_ok, sum(w * s for w, s in zip(rubrics[g].weights, matrix[k])),
                             "valid" if a.valid else ("no report" if not a.answer else a.reason.split(" (")[0]), g))
    score = np.array([r[2] for r in rows])
    valid = np.array([r[0] for r in rows], dtype=bool)
    cited = np.array([r[1] for r in rows], dtype=bool)
    group = np.array([r[4] for r in rows])
    gv, gv_lo, gv_hi = _gap(score, valid, group, brng)
    gc, gc_lo, gc_hi = _gap(score, cited, group, brng)
    n_reports = len(evals) * K
    mean = lambda side: score[side].mean() if side.any() else float("nan")  # noqa: E731
    print(f"[{protocol}] scored reports {len(rows)}/{n_reports}: valid {int(valid.sum())} mean {mean(valid):.3f}, "
          f"invalid {int((~valid).sum())} mean {mean(~valid):.3f}")
    by_reason: dict[str, list[float]] = {}
    for r in rows:
        by_reason.setdefault(r[3], []).append(r[2])
    print(f"[{protocol}] mean score by report: "
          + ", ".join(f"{k} {np.mean(v):.3f} (n={len(v)})" for k, v in sorted(by_reason.items())))
    valid_rate = np.mean([v for e in evals for v in e.evaluations_valid])
    print(f"protocol={protocol} scoring_valid_rate={valid_rate:.3f} report_valid_rate={len(rows) / n_reports:.3f} "
          f"incomplete_rate={np.mean([not e.complete for e in evals]):.3f} "
          f"gap_valid={gv:+.3f} gap_valid_ci=[{gv_lo:+.3f},{gv_hi:+.3f}] "
          f"gap_cited={gc:+.3f} gap_cited_ci=[{gc_lo:+.3f},{gc_hi:+.3f}]")


if __name__ == "__main__":
    sys.exit(main())
