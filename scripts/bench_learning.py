#!/usr/bin/env python
"""Learning evidence on the embedded default: conditions x seeds, held-out sampled grounded validity, CIs.

    python scripts/bench_learning.py --conditions frozen_solver,rule,grpo_baseline,score --seeds 31 32 33 34 35 \\
        --steps 160 --archive docs/studies/v9                         # the study (docs/studies/v9.md)
    python scripts/bench_learning.py --only score:0 --tag lr2e-4 --set optim.lr=2e-4 --horizons 80,160,240 \\
        --steps 240 --out logs/tuning --threads 1                     # one tuning cell (run two at a time)
    python scripts/bench_learning.py --merge logs/tuning --tag lr2e-4 --conditions score --seeds 0 1 --steps 240 \\
        --horizons 80,160,240 --no-append                             # its table, from the cells on disk

Each (condition, seed) trains from its recipe's cached cold start to each horizon in turn (resuming its own
run folder), and every horizon's export is rolled out by ``scripts/evaluate.py`` on the 20 held-out
embedded queries (which no training batch, cold-start demonstration or tokenizer text contains),
``--samples`` times per query at the run's own solver temperature, under the run's own prompt and budgets.
The card's ``grounded_valid`` is the share of sampled answers valid under the reward's own a(r) rule
(closed, cited, every citation retrieved). Each condition's cold-start model gets the same card once, under
that condition's settings (the card comparison refuses any other); learning is the change over it. Conditions
with one cold start and one set of settings share its card; a relative with its own cold start or workflow is
measured over its own.

``--evaluator-pairs FILE`` also scores each condition's evaluator on a stored pair set
(``scripts/bench_evaluator.py --pair-set``) at its cold start and at the last horizon; ``--evaluator-probe``
also runs ``bench_evaluator.py --seed 1`` there, each model writing the held-out reports it then scores; ``--against NAME`` limits
the paired differences to each condition against NAME. Each method's health scalars (the rubric writers'
failures, items per query, the step and stage judges' parse rates, invalid actions) and seconds per step are
tabled where its cells logged them.

Reported per condition, mean and 95% t-interval over seeds: the change in held-out grounded validity at
each horizon, the reward's least-squares slope over all steps (per 100 steps), and the paired (same seed)
differences between conditions. The last lines are one per condition::

    condition=NAME seeds=N heldout_valid_delta=+x heldout_valid_delta_ci=[lo,hi] heldout_recall_delta=+r
        heldout_recall_delta_ci=[lo,hi] reward_slope=+y reward_slope_ci=[lo,hi]

(one line each; ``heldout_recall_delta`` is the change in the card's ``item_recall``, the share of each held-out
query's evidence items a sampled answer satisfies; ``nan`` for cards made before it existed.) Just before them,
one line per paired difference (each condition against ``--against``, or every pair), same seeds, each side's
change over its own cold start::

    pair=A-B seeds=N heldout_valid_delta=+x heldout_valid_delta_ci=[lo,hi] heldout_recall_delta=+r
        heldout_recall_delta_ci=[lo,hi]

``--tuning-seeds`` are run and reported apart, never pooled with the study's seeds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))

from study_cells import (  # noqa: E402
    evaluator_readings, guard_stop, relative, run_in_lanes, run_logged, train_horizons, training_summary,
)
from study_report import T975, ci95, fmt, paired_lines, report, study_page, summary_lines, write_section  # noqa: E402

CONDITIONS: dict[str, list[str]] = {
    "score": ["experiment=tiny_score"],
    "grpo_baseline": ["experiment=grpo_baseline"],
    "rule": ["experiment=rule_tiny"],
    "frozen_solver": ["experiment=tiny_score", "solver.freeze=true", "actor.shared=false"],
    "no_harness": ["experiment=tiny_score", "harness.enabled=false"],
    "no_verifier": ["experiment=tiny_score", "verifier.enabled=false"],
    "no_consistency": ["experiment=tiny_score", "evaluator.reward=solver_reward"],
    # the paper's claim that a static reward is hacked where a co-evolving evaluator is not: any bracketed id counts
    "score_any": ["experiment=tiny_score", "reward.citations=any"],
    "grpo_any": ["experiment=grpo_baseline", "reward.citations=any"],
    # what one step of staleness does to learning: the worker generates step t+1 while the trainer updates on t
    "score_async": ["experiment=tiny_score", "rollout.mode=async"],
    # rubric methods and solver workflows (same budget, same logs)
    "evolving": ["experiment=rler_tiny"],
    "evolving_initial": ["experiment=rler_tiny", "rubric.evolve=false"],  # DR Tulu's initial-rubrics-only ablation
    "given": ["experiment=given_tiny"],  # the bundled DeepResearch Bench criteria (criteria_tiny.jsonl)
    # the query's evidence items as its given rubric (binary checklist items: the passage to cite, the key terms)
    "given_items": ["experiment=given_tiny", "rubric.path=${paths.root_dir}/src/score_lightning/data/assets/items.jsonl"],
    "evorubric": ["experiment=evorubric_tiny"],
    "preference": ["experiment=preference_tiny"],
    "drrubric": ["experiment=drrubric_tiny"],
    "mams": ["experiment=mams_tiny"],
    "arco": ["experiment=arco_tiny"],
    "rubricem": ["experiment=rubricem_tiny"],
    "dpo": ["experiment=dpo_tiny"],  # the paper's DPO baseline, online (methods/dpo; issue 70)
    # a real pretrained model (SmolLM2-135M-Instruct) with its own cold start: its own table, never pooled
    "smol_score": ["experiment=smol_score"],
    "smol_rule": ["experiment=rule_smol"],
    "smol_frozen": ["experiment=smol_score", "solver.freeze=true", "actor.shared=false"],
    # past saturation (issue 50): SmolLM2's static-rubric GRPO arm, and the rule arm on validity alone
    "smol_grpo": ["experiment=grpo_smol"],
    "smol_rule_valid": ["experiment=rule_smol", "reward.rule_quality=none"],
    # tiny's programmatic upper bound on report quality: the rule reward on the query's evidence items
    "rule_items": ["experiment=rule_tiny", "reward.rule_quality=item_recall"],
    "rule_valid": ["experiment=rule_tiny", "reward.rule_quality=none"],
}
DEFAULT = "frozen_solver,rule,grpo_baseline,score"
#: conditions trained without an evaluator (a programmatic reward): ``--evaluator-pairs`` skips them
NO_EVALUATOR = {"rule", "rule_valid", "rule_items", "smol_rule", "smol_rule_valid"}
CARD_KEYS = ("grounded_valid", "format_valid", "citation_precision", "coverage", "item_recall", "citations", "length")


def cell_dir(out: Path, cond: str, tag: str, seed: int) -> Path:
    return out / (f"{cond}@{tag}" if tag else cond) / f"seed{seed}"


def heldout_card(model: Path, out: Path, samples: int, settings_of: Path | None = None,
                 threads: int | None = None, greedy: bool = False) -> dict:
    """Sampled held-out card of ``model`` (cached in ``out``); ``settings_of``: a run export whose prompt, budgets,
    temperature and reward rule the rollouts take (the cold start's card is made under a run's settings).
    ``greedy``: one greedy rollout per query instead (the secondary card)."""
    card = out / "heldout.card.json"
    if not card.is_file():
        out.mkdir(parents=True, exist_ok=True)
        arts = out / "heldout.jsonl"
        flags = ["--run-config", str(settings_of / "run_config.json")] if settings_of is not None else []
        flags += ["--samples", "1", "--temperature", "0"] if greedy else ["--samples", str(samples)]
        run_logged([sys.executable, "scripts/evaluate.py", "--model", str(model), "--queries", "embedded", "--split",
                    "heldout", "--out", str(arts), "--no-progress", *flags], out / "generate.log", threads)
        run_logged([sys.executable, "scripts/evaluate.py", "card", "--articles", str(arts), "--out", str(card)],
                   out / "card.log", threads)
    return json.loads(card.read_text())


def study_subject(export: Path) -> str:
    """The model a study trained, for its figure's title: a packaged GGUF by its file, a checkpoint by its path."""
    model = json.loads((export / "run_config.json").read_text()).get("model") or {}
    if (model.get("gguf") or {}).get("file"):
        return Path(model["gguf"]["file"]).name.split(".")[0]
    return str(model.get("name_or_path") or "the embedded default")


def card_values(card: dict) -> dict:
    """The card's means, and its per-query grounded validity (for paired, query-level comparisons)."""
    s = card["summary"]
    out = {k: s[k]["mean"] for k in CARD_KEYS if k in s}
    out["per_query_grounded_valid"] = {str(r["id"]): r.get("grounded_valid") for r in card.get("per_query", [])}
    out["settings"] = card.get("settings")
    return out


def run_cell(cond: str, seed: int, horizons: list[int], out: Path, tag: str, extra: list[str], samples: int,
             train_only: bool, threads: int | None, pair_set: Path | None = None, probe: bool = False) -> dict | None:
    """Train one (condition, seed) to every horizon and card each export; ``result.json`` caches it.
    ``pair_set``: also score the condition's evaluator on that stored pair set at its cold start and at the end;
    ``probe``: also let each write and score its own held-out reports (``study_cells.evaluator_readings``)."""
    run = cell_dir(out, cond, tag, seed)
    done = run / "result.json"
    extra = extra + ([f"threads.num={threads}"] if threads else [])
    if done.exists():
        result = json.loads(done.read_text())
    else:
        exports = train_horizons(CONDITIONS[cond] + extra, seed, horizons, run, threads)
        if train_only:
            return None
        cards = {h: card_values(heldout_card(e, run / f"card_s{h}", samples, threads=threads)) for h, e in exports.items()}
        last = max(horizons)
        greedy = card_values(heldout_card(exports[last], run / f"card_s{last}_greedy", 1, threads=threads, greedy=True))
        cold = json.loads((exports[max(horizons)] / "run_config.json").read_text()).get("cold_start_model")
        result = {"condition": cond, "seed": seed, "tag": tag, "set": extra, "horizons": sorted(horizons),
                  "train": training_summary(run), "heldout": {str(h): c for h, c in cards.items()},
                  "heldout_greedy": greedy, "export": str(exports[max(horizons)]),
                  "cold_start_model": cold or _model_path(run), "guard_stop": guard_stop(run)}
    if cond not in NO_EVALUATOR:
        evaluator_readings(result, CONDITIONS[cond] + extra, out / f"evaluator_cold@{tag or 'default'}" / cond, run,
                           _resolve(result["export"]), pair_set, probe, threads)
    done.write_text(json.dumps(result, indent=1))
    return result


def cold_card_name(tag: str, model: Path, settings: dict | None) -> str:
    """The cache folder's name of a cold start's card: the tag, the cold start and a digest of the card settings.
    Keyed by what was carded, not by the merge's order, so a merge over other conditions (a lane's own report, a
    subset) never reads another cold start's cached card."""
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"{tag or 'default'}-{model.name}-{digest}"


def cold_cards(results: list[dict], out: Path, tag: str, samples: int, threads: int | None) -> dict[str, dict]:
    """Each condition's cold start carded once, under that condition's own settings (its first cell's export):
    relatives start from their own cold starts and roll out their own workflows, so each change is measured
    over its own starting point. Conditions sharing a cold start and settings share one card. Every cell's
    cards must have been made under its cold card's settings."""
    from score_lightning.evaluation.settings import describe_diff, settings_diff

    made: list[tuple[Path, dict, dict]] = []
    colds: dict[str, dict] = {}
    for cond in dict.fromkeys(r["condition"] for r in results):
        first = next(r for r in results if r["condition"] == cond)
        ref, model = _resolve(first["export"]), _resolve(first["cold_start_model"])
        if not model.is_dir():
            raise SystemExit(f"the cold start {model} is not on this machine; one training step installs it: "
                             f"python src/train.py {' '.join(CONDITIONS[cond])} trainer.max_steps=1")
        settings = first["heldout"][str(max(map(int, first["heldout"])))].get("settings")
        card = next((c for m, s, c in made if m == model and not settings_diff(s, settings)), None)
        if card is None:
            name = cold_card_name(tag, model, settings)
            card = card_values(heldout_card(model, out / f"cold_start@{name}", samples, settings_of=ref,
                                            threads=threads))
            if settings_diff(card.get("settings"), settings):  # a cached card of another merge's settings
                raise SystemExit(f"{out / f'cold_start@{name}'} was carded under other settings than {cond}'s: "
                                 f"{describe_diff(card.get('settings'), settings)}; remove it and merge again")
            card["greedy"] = card_values(heldout_card(model, out / f"cold_start_greedy@{name}", 1, settings_of=ref,
                                                      threads=threads, greedy=True))
            made.append((model, settings, card))
        colds[cond] = card
    for r in results:  # a delta over the cold start measures the model only under equal settings
        for h, card in r["heldout"].items():
            if settings_diff(card.get("settings"), colds[r["condition"]].get("settings")):
                raise SystemExit(f"{r['condition']}:{r['seed']} at {h} steps was carded under other settings than "
                                 f"its cold start: {describe_diff(card.get('settings'), colds[r['condition']].get('settings'))}")
    return colds


def archive_cell(result: dict, archive: Path) -> Path:
    """A portable copy of a finished cell under ``archive`` (a tracked folder): its ``result.json`` with paths
    relative to the repository, its last export's ``run_config.json`` (the settings the merge cards the
    cold start under) and ``environment.json`` (package versions and CPU, for comparing reruns). A study spans
    sessions; ``logs/`` does not, so what a merge reads must live in git."""
    run = cell_dir(archive, result["condition"], result.get("tag", ""), result["seed"])
    run.mkdir(parents=True, exist_ok=True)
    export = _resolve(result["export"])
    (run / "run_config.json").write_text((export / "run_config.json").read_text())
    if (export / "environment.json").is_file():  # package versions and CPU (exports written before it have none)
        (run / "environment.json").write_text((export / "environment.json").read_text())
    portable = dict(result, export=relative(run, ROOT),
                    cold_start_model=relative(_resolve(result["cold_start_model"]), ROOT))
    (run / "result.json").write_text(json.dumps(portable, indent=1) + "\n")
    return run


def _resolve(path: str) -> Path:
    """An archived cell's paths are relative to the repository; a local cell's are absolute."""
    p = Path(path)
    return p if p.is_absolute() else ROOT / p


def _model_path(run: Path) -> str:
    import torch

    ckpt = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    return ckpt["hyper_parameters"]["model_path"]


def load_results(dirs: list[Path], tag: str) -> list[dict]:
    """Every cell's ``result.json`` below ``dirs`` with this tag, each file once. Two different results for one
    cell are refused (pooled twice, a cell would narrow every interval); a cell and its archived copy (the same
    cards and curves) count once."""
    files = sorted({p.resolve() for d in dirs for p in d.rglob("result.json")})
    cells: dict[tuple[str, int], tuple[Path, dict]] = {}
    for path in files:
        r = json.loads(path.read_text())
        if r.get("tag", "") != tag:
            continue
        key = (r["condition"], r["seed"])
        if key in cells:
            seen, first = cells[key]
            if all(first.get(f) == r.get(f) for f in ("heldout", "heldout_greedy", "train", "set")):
                continue
            raise SystemExit(f"two results for {key[0]}:{key[1]}: {seen} and {path}; merge one of them")
        cells[key] = (path, r)
    return [r for _, r in cells.values()]


def _lanes(args: argparse.Namespace, conditions: list[str], out: Path) -> list[dict]:
    """``--lanes N``: every cell as its own ``--only`` process, N at a time; then the finished cells' results."""
    args.threads = args.threads or max(1, (os.cpu_count() or 1) // args.lanes)
    cells = [(c, s) for s in args.seeds + args.tuning_seeds for c in conditions]
    flags = ["--steps", str(args.steps), "--horizons", ",".join(map(str, args.horizons)), "--samples", str(args.samples),
             "--out", str(out.resolve()), "--threads", str(args.threads), *(["--tag", args.tag] if args.tag else []),
             *(["--archive", str(Path(args.archive).resolve())] if args.archive else []),
             *(["--train-only"] if args.train_only else []),
             *(["--evaluator-pairs", str(Path(args.evaluator_pairs).resolve())] if args.evaluator_pairs else []),
             *(["--evaluator-probe"] if args.evaluator_probe else []), *(["--set", *args.set] if args.set else [])]
    failed = run_in_lanes(cells, args.lanes, lambda c, s: [sys.executable, __file__, "--only", f"{c}:{s}", *flags],
                          out / "lanes", args.threads)
    if failed:
        raise SystemExit("cells failed (rerun the same command: finished cells are kept, a stopped one resumes):\n  "
                         + "\n  ".join(failed))
    wanted = set(cells)
    found = load_results([out, *([Path(args.archive)] if args.archive else [])], args.tag)
    return [r for r in found if (r["condition"], r["seed"]) in wanted]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conditions", default=DEFAULT, help=f"comma list of {sorted(CONDITIONS)}")
    ap.add_argument("--modes", default=None, help="alias of --conditions (rubric methods, solver workflows)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[31, 32, 33, 34, 35],
                    help="the study's seeds, fixed before its first run (development seeds 0-9 are for tuning)")
    ap.add_argument("--tuning-seeds", type=int, nargs="*", default=[], help="seeds the settings were tuned on (own table)")
    ap.add_argument("--steps", type=int, default=160, help="SCORE steps per run (the last horizon), fixed in advance")
    ap.add_argument("--horizons", default=None, help="comma list of step counts to card (default: --steps only)")
    ap.add_argument("--samples", type=int, default=8, help="held-out rollouts per query (20 queries x 8: about +-0.03)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="extra Hydra overrides for every cell")
    ap.add_argument("--tag", default="", help="names a --set variant: its cells live in <out>/<condition>@<tag>/")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads per process (1: two cells side by side)")
    ap.add_argument("--out", default=str(ROOT / "logs" / "bench_learning"))
    ap.add_argument("--only", default=None, help="run one cell CONDITION:SEED and stop (one machine of many)")
    ap.add_argument("--train-only", action="store_true", help="with --only: train (every horizon), card later")
    ap.add_argument("--lanes", type=int, default=1, help="run the cells as N processes at a time (seed-major), "
                    "each with --threads torch threads (default: the CPUs / N), then merge them; a failed cell is "
                    "listed at the end (exit 1) and the others still run")
    ap.add_argument("--archive", default=None, help="copy each finished cell's result here (a tracked folder), "
                    "so a study that spans sessions merges from git, e.g. docs/studies/v9")
    ap.add_argument("--merge", nargs="*", default=None, help="read result.json files below these dirs; train nothing")
    ap.add_argument("--no-append", action="store_true", help="print the table; leave the study's page alone")
    ap.add_argument("--page", default=None, help="the study's page to append to (default: beside --archive, "
                    "docs/studies/v9 -> docs/studies/v9.md; without one docs/studies/learning-DATE.md)")
    ap.add_argument("--against", default=None, help="paired differences of each condition against this one only "
                    "(default: every pair)")
    ap.add_argument("--evaluator-pairs", default=None, metavar="PAIRS.jsonl",
                    help="score each condition's evaluator on this stored pair set (bench_evaluator.py --pair-set) "
                    "at its cold start and at the last horizon")
    ap.add_argument("--evaluator-probe", action="store_true",
                    help="also run bench_evaluator.py --seed 1 (its defaults) on each evaluator condition's cold start "
                    "and last export: each writes its own held-out reports and scores their pairs")
    ap.add_argument("--figure", default=None, help="write a PNG of the curves and the held-out changes (bench extra)")
    args = ap.parse_args()
    conditions = [c for c in (args.modes or args.conditions).split(",") if c]
    unknown = [c for c in conditions if c not in CONDITIONS]
    if unknown:
        ap.error(f"unknown condition(s) {unknown}; allowed {sorted(CONDITIONS)}")
    horizons = sorted({int(h) for h in (args.horizons.split(",") if args.horizons else [args.steps])} | {args.steps})
    args.horizons = horizons
    if max(horizons) != args.steps:
        ap.error(f"--horizons {horizons} must not go past --steps {args.steps}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    def cell(c: str, s: int) -> dict | None:
        archived = cell_dir(Path(args.archive), c, args.tag, s) / "result.json" if args.archive else None
        if archived is not None and archived.is_file() and not (cell_dir(out, c, args.tag, s) / "result.json").is_file():
            return json.loads(archived.read_text())  # finished in an earlier session whose logs/ is gone: kept
        result = run_cell(c, s, horizons, out, args.tag, list(args.set), args.samples, args.train_only, args.threads,
                          Path(args.evaluator_pairs).resolve() if args.evaluator_pairs else None, args.evaluator_probe)
        if result is not None and args.archive:
            archive_cell(result, Path(args.archive))
        return result

    if args.only:
        cond, seed = args.only.split(":")
        if cond not in CONDITIONS:
            ap.error(f"unknown condition {cond!r}")
        print(json.dumps(cell(cond, int(seed)), default=str)[:2000])
        return 0
    if args.merge is not None:
        results = load_results([out, *map(Path, args.merge)], args.tag)
        results = [r for r in results if r["condition"] in conditions and r["seed"] in args.seeds + args.tuning_seeds]
    else:  # each cell its own process, N at a time: a failed cell is reported at the end and stops no other cell
        results = _lanes(args, conditions, out)
        if args.train_only:
            print(f"trained {len(conditions) * len(args.seeds + args.tuning_seeds)} cells; card them with --lanes "
                  f"{args.lanes} without --train-only")
            return 0
    if not results:
        raise SystemExit("no results")
    colds = cold_cards(results, out, args.tag, args.samples, args.threads)
    ref = _resolve(results[0]["export"])
    fresh = [r for r in results if r["seed"] not in args.tuning_seeds]
    tuned = [r for r in results if r["seed"] in args.tuning_seeds]
    text = report(fresh, colds, conditions, horizons, args.against)
    if tuned:
        text += "\n\nTuning seeds (reported apart, never pooled):\n\n" + report(tuned, colds, conditions, horizons,
                                                                                   args.against)
    lines = (paired_lines(fresh, colds, conditions, args.steps, args.against)
             + summary_lines(fresh, colds, conditions, args.steps))
    print(text)
    if args.figure:
        from learning_figure import draw

        draw(fresh, colds, conditions, Path(args.figure), T975, str(args.steps), subject=study_subject(ref),
             against=args.against)
        print(f"figure: {args.figure}")
    if not args.no_append:
        write_section(text, lines, sys.argv, conditions, sorted({r["seed"] for r in fresh}), horizons, args.samples,
                      study_page(args.archive, args.page))
    print("\n".join(lines))
    return 0


__all__ = ["CONDITIONS", "T975", "ci95", "fmt", "load_results", "main"]

if __name__ == "__main__":
    sys.exit(main())
