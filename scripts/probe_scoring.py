#!/usr/bin/env python
"""Do the evaluator's scores carry signal? Sample step-like evaluations from a checkpoint and measure.

    python scripts/probe_scoring.py                                   # tiny_score's own (packaged) cold start
    python scripts/probe_scoring.py --groups 40 experiment=smol_score # smol_score's cold start (trained once, cached)
    python scripts/probe_scoring.py --model logs/run/export --groups 40 evaluator.constrained_scoring=false
    python scripts/probe_scoring.py --model smollm2_135m --groups 40 experiment=smol_score   # the zero-shot preset
    python scripts/probe_scoring.py --scoring joint,pointwise          # both protocols on the same reports
    python scripts/probe_scoring.py --readout sampled,expected         # both score readouts of the same evaluations

Each group is one step of one query, sampled as RL samples it: a rubric from the rubric prompt (the
harness's initial state and the scheduler's first hints; the fallback rubric if it does not parse),
K solver rollouts with the retriever, and the evaluation of the K reports by the step's own scoring stage:
one evaluation of all K (``evaluator.scoring=joint``) or one per report (``pointwise``), constrained or
not as the config says. ``--scoring joint,pointwise`` scores the same groups under each protocol. The same
reports are scored twice per protocol: under each group's sampled rubric (``rubric=sampled``) and under the
harness's fallback rubric (``rubric=fallback``). ``--readout sampled,expected`` reads every evaluation both ways
(``evaluator.score_readout``; ``expected`` needs constrained scoring). Reported: how many evaluations and single
reports parse, whether the rubric-weighted scores separate valid reports (a(r) = 1) from invalid ones (also split
by why a report is invalid: no report shown, no citation, ...) and reports whose citations were all retrieved from
the others, each a difference of means with a 95% bootstrap interval over groups (a group's reports share one
evaluation); and whether, among a group's valid reports, the scores rank them as the programmatic quality q(r) of
``reward.rule_quality`` does (``retrieved_cited`` unless the config sets it; :mod:`score_lightning.rewards.rule`):
Kendall's tau-b per group, averaged over the groups with two valid reports that are not all tied, with a 95%
group-bootstrap interval (:mod:`score_lightning.rewards.score_signal`). One ``key=value`` line per protocol,
rubric and readout. ``--demos N`` first fits N fresh scoring demos teacher-forced
(:mod:`score_lightning.sft.demo_fit`): whether the model gets the scores right when the verification text is
given, and whether it writes that text right.
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
    from score_lightning.launch.schema import compose_config

    return compose_config(overrides, ROOT / "configs")


def recipe_cold_start(cfg) -> str:
    """The checkpoint the recipe's RL starts from, found as ``train.py`` finds it: its base model, then its
    cold start (the packaged one installed, or trained once and cached) when the recipe runs SFT. A probe of a
    recipe must judge the evaluator that recipe trains, not another recipe's."""
    import copy
    import tempfile

    from omegaconf import open_dict

    from score_lightning.launch.config_validation import validate_config
    from score_lightning.launch.training import maybe_run_sft, resolve_model_path

    cfg = copy.deepcopy(cfg)
    with open_dict(cfg):  # the cold start's own logs (a run folder the probe does not keep)
        cfg.paths.output_dir = tempfile.mkdtemp(prefix="probe_cold_start_")
    validate_config(cfg)
    return maybe_run_sft(cfg, resolve_model_path(cfg))


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
    from score_lightning.step.evaluations import group_evaluations
    from score_lightning.step.reward_assembly import parse_answers
    from score_lightning.rewards.rule import rule_quality
    from score_lightning.step.rollouts import rollout_settings, scoring_rollouts, solver_rollouts

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None,
                    help="checkpoint directory or model preset, e.g. smollm2_135m (zero-shot); default: the recipe's "
                         "own cold start, installed or trained as train.py does")
    ap.add_argument("--groups", type=int, default=40, help="step-like groups (one query, K reports, one evaluation)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--demos", type=int, default=0,
                    help="also fit N fresh scoring demos teacher-forced, per report kind (score_lightning.sft.demo_fit)")
    ap.add_argument("--scoring", default=None,
                    help="comma list of protocols to score the same groups with (default: evaluator.scoring)")
    ap.add_argument("--readout", default=None,
                    help="comma list of score readouts to read the same evaluations with, sampled and/or expected "
                         "(default: evaluator.score_readout)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides (default experiment=tiny_score)")
    args = ap.parse_args()
    cfg = _compose(["experiment=tiny_score", *args.overrides])
    readouts = (args.readout or str(cfg.evaluator.get("score_readout", "sampled"))).split(",")
    if not set(readouts) <= {"sampled", "expected"}:
        ap.error(f"--readout {args.readout}: sampled and/or expected")
    if "expected" in readouts and not bool(cfg.evaluator.get("constrained_scoring", False)):
        ap.error("--readout expected needs evaluator.constrained_scoring=true (the grammar marks each score's value)")
    from score_lightning.launch.cpu_memory import set_malloc_mmap_threshold
    from score_lightning.launch.training import resolve_model_arg

    set_malloc_mmap_threshold(cfg.trainer.get("malloc_mmap_threshold_mb"))
    own = args.model is None
    args.model = recipe_cold_start(cfg) if own else resolve_model_arg(args.model, cfg.paths.cache_dir)
    print(f"model: {args.model}" + (" (the recipe's own cold start)" if own else ""), flush=True)
    tok = load_tokenizer(args.model)
    model = load_policy(args.model, "float32").eval()
    retriever = retriever_from_config(cfg.retriever, cfg.paths.cache_dir)
    settings = rollout_settings(cfg.solver, cfg.evaluator)
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
        from score_lightning.sft.demo_types import demo_budgets

        ctx = DemoContext.create(tok, retriever, queries, demo_budgets(cfg.solver, cfg.evaluator), state)
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
    answers = parse_answers(trajs, tok, cfg.reward)  # a(r) under the config's rules (reward.citations)
    K = settings.num_rollouts
    reports = [[a.answer if a.answer else None for a in answers[g * K:(g + 1) * K]] for g in range(args.groups)]  # as RL
    sources = [[t.retrieved_ids for t in trajs[g * K:(g + 1) * K]] for g in range(args.groups)]
    kind = str(cfg.reward.get("rule_quality", "retrieved_cited"))  # q(r): the rule reward's, ranked against
    tops = [[h.id for h in hits] for hits in retriever.search(group_queries, int(cfg.solver.topk))] \
        if kind == "coverage" else [[] for _ in group_queries]  # D_q^0: the query's top BM25 passages
    items_of = {}
    if kind == "item_recall":  # the query's evidence items (reward.items_path), found by prompt
        from score_lightning.data.items import load_items

        items_of = {e.prompt: e.items for e in load_items(cfg.reward.get("items_path")).values()}
    quality = [rule_quality(kind, a.cited_ids, t.retrieved_ids, tops[i // K], report=a.answer or "",
                            items=items_of.get(group_queries[i // K], ()))
               for i, (a, t) in enumerate(zip(answers, trajs))]
    print(f"groups {args.groups} (K={K}), rubrics sampled valid {np.mean([p.valid for p in parses]):.2f}, "
          f"answers valid {np.mean([a.valid for a in answers]):.2f}, constrained scoring {settings.constrained_scoring}, "
          f"show_retrieved {settings.show_retrieved}, quality {kind}")
    rubric_sets = {"sampled": rubrics, "fallback": [fallback_rubric(state)] * args.groups}
    for protocol in (args.scoring or str(cfg.evaluator.scoring)).split(","):
        # the expected readout is read while scoring, beside the written values: one scoring serves both readouts
        proto = replace(settings, scoring_protocol=protocol,
                        score_readout="expected" if "expected" in readouts else "sampled")
        # a group is one scoring row jointly and K pointwise: as many groups per generate call as rows fit
        rows = K if protocol == "pointwise" else 1
        step = max(1, engine.max_batch_size // rows)
        for name, rs in rubric_sets.items():
            scoring = [t for s in range(0, args.groups, step)
                       for t in scoring_rollouts(engine, tok, retriever, group_queries[s:s + step], reports[s:s + step],
                                                 rs[s:s + step], state, proto, sources[s:s + step])]
            for readout in readouts:
                evals = group_evaluations(scoring, rs, K, protocol, state.process_constraints, tok, readout)
                _report(protocol, name, readout, evals, rs, answers, trajs, quality, K, args.seed)
    return 0


def _report(protocol: str, rubric: str, readout: str, evals, rubrics, answers, trajs, quality: list[float], K: int,
            seed: int) -> None:
    """Among reports whose scores parsed: separation of the rubric-weighted scores (valid vs invalid, and reports
    citing only retrieved ids vs the rest) and their within-group ranking of the valid reports against q(r);
    a ``key=value`` line per protocol, rubric and readout."""
    from score_lightning.rewards.score_signal import score_gap, within_group_tau

    brng = np.random.default_rng(seed)
    rows = []
    for g, ev in enumerate(evals):
        matrix = ev.parse.score_matrix(rubrics[g], K)
        for k in range(K):
            a, t = answers[g * K + k], trajs[g * K + k]
            cited_ok = bool(a.cited_ids) and all(c in t.retrieved_ids for c in a.cited_ids)
            if ev.report_valid(k + 1):
                rows.append((a.valid, cited_ok, sum(w * s for w, s in zip(rubrics[g].weights, matrix[k])),
                             "valid" if a.valid else ("no report" if not a.answer else a.reason.split(" (")[0]), g,
                             quality[g * K + k]))
    score = np.array([r[2] for r in rows])
    valid = np.array([r[0] for r in rows], dtype=bool)
    cited = np.array([r[1] for r in rows], dtype=bool)
    group = np.array([r[4] for r in rows])
    gv, gv_lo, gv_hi = score_gap(score, valid, group, brng)
    gc, gc_lo, gc_hi = score_gap(score, cited, group, brng)
    tau = within_group_tau(score, np.array([r[5] for r in rows]), valid, group, seed)
    n_reports = len(evals) * K
    mean = lambda side: score[side].mean() if side.any() else float("nan")  # noqa: E731
    tag = f"[{protocol}, {rubric} rubric, {readout} readout]"
    print(f"{tag} scored reports {len(rows)}/{n_reports}: valid {int(valid.sum())} mean {mean(valid):.3f}, "
          f"invalid {int((~valid).sum())} mean {mean(~valid):.3f}")
    by_reason: dict[str, list[float]] = {}
    for r in rows:
        by_reason.setdefault(r[3], []).append(r[2])
    print(f"{tag} mean score by report: "
          + ", ".join(f"{k} {np.mean(v):.3f} (n={len(v)})" for k, v in sorted(by_reason.items())))
    print(f"{tag} valid - invalid {gv:+.3f} [{gv_lo:+.3f},{gv_hi:+.3f}]; among valid reports, Kendall tau-b of score "
          f"vs q {tau.tau:+.3f} [{tau.lo:+.3f},{tau.hi:+.3f}] over {tau.groups} groups ({tau.few} with < 2 valid "
          f"reports, {tau.tied} all tied)")
    valid_rate = np.mean([v for e in evals for v in e.evaluations_valid])
    print(f"protocol={protocol} rubric={rubric} readout={readout} scoring_valid_rate={valid_rate:.3f} "
          f"report_valid_rate={len(rows) / n_reports:.3f} "
          f"incomplete_rate={np.mean([not e.complete for e in evals]):.3f} "
          f"gap_valid={gv:+.3f} gap_valid_ci=[{gv_lo:+.3f},{gv_hi:+.3f}] "
          f"gap_cited={gc:+.3f} gap_cited_ci=[{gc_lo:+.3f},{gc_hi:+.3f}] "
          f"tau_valid={tau.tau:+.3f} tau_valid_ci=[{tau.lo:+.3f},{tau.hi:+.3f}] tau_groups={tau.groups} "
          f"tau_excluded={tau.excluded}")


if __name__ == "__main__":
    sys.exit(main())
