#!/usr/bin/env python
"""Learning evidence on the embedded default: conditions x fresh seeds, held-out report cards, CIs.

    python scripts/bench_learning.py                                  # the default study (see below)
    python scripts/bench_learning.py --conditions score,grpo_baseline --seeds 11 12 --steps 40
    python scripts/bench_learning.py --modes score,evolving,given,grpo_baseline   # rubric methods
    python scripts/bench_learning.py --only score:11 --out /shared/bench --no-append  # one cell (a machine)
    python scripts/bench_learning.py --merge /shared/bench --out logs/bench_learning   # table from many cells
    python scripts/bench_learning.py --figure docs/learning_study.png     # also draw the curves and the card's changes

Each (condition, seed) trains ``trainer.max_steps`` SCORE steps from the shared, cached cold start,
then ``scripts/evaluate.py`` rolls its final export out (greedy) on the 20 held-out embedded queries,
which no training batch, cold-start demonstration or tokenizer text contains, and scores them with
the programmatic report card (citation precision, coverage of the query's top BM25 passages,
answer validity, length). The cold-start model gets the same card once: learning is measured as the
change over it (generated under the runs' own solver budgets, read from their
exports). Reported per condition: mean and 95% t-interval over seeds of the training reward
and its two parts (last 20% of steps minus first 20%), and of each held-out metric's change; and the
paired (same seed) difference of each condition against SCORE. The table is appended to
``docs/BENCHMARKS.md`` with the exact command. ``--tuning-seeds`` (the seeds the settings were tuned
on) are run and reported in a separate table, never pooled with the fresh seeds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from statistics import mean, stdev

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

CONDITIONS: dict[str, list[str]] = {
    "score": ["experiment=tiny_score"],
    "grpo_baseline": ["experiment=grpo_baseline"],
    "no_harness": ["experiment=tiny_score", "harness.enabled=false"],
    "no_verifier": ["experiment=tiny_score", "verifier.enabled=false"],
    "frozen_solver": ["experiment=tiny_score", "solver.freeze=true", "actor.shared=false"],
    "no_consistency": ["experiment=tiny_score", "evaluator.reward=solver_reward"],
    # rubric methods and solver workflows (same budget, same logs)
    "evolving": ["experiment=rler_tiny"],
    "given": ["experiment=given_tiny"],
    "evorubric": ["experiment=evorubric_tiny"],
    "mams": ["experiment=mams_tiny"],
    "arco": ["experiment=arco_tiny"],
    # a real pretrained model (SmolLM2-135M-Instruct) with its own cold start: its own table, never pooled
    "smol_score": ["experiment=smol_score"],
}
DEFAULT = "score,grpo_baseline,no_harness,no_verifier,frozen_solver"
TRAIN_TAGS = ("solver/reward_mean", "solver/reward_validity_part", "solver/reward_score_part")
CARD = ("citation_precision", "coverage", "validity", "length")
#: this table's column names -> the card's metric names (the card's format rule is ``format_valid``)
CARD_KEYS = {"validity": "format_valid"}
#: two-sided 97.5% quantiles of Student's t by degrees of freedom (95% intervals over seeds)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def ci95(values: list[float]) -> tuple[float, float, int]:
    """Mean and half-width of the 95% t-interval (NaN half-width with fewer than 2 values)."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return math.nan, math.nan, 0
    if len(vals) < 2:
        return vals[0], math.nan, 1
    return mean(vals), T975.get(len(vals) - 1, 1.96) * stdev(vals) / math.sqrt(len(vals)), len(vals)


def fmt(values: list[float], digits: int = 3) -> str:
    m, h, n = ci95(values)
    if n == 0:
        return "n/a"
    return f"{m:+.{digits}f}" + ("" if math.isnan(h) else f" ± {h:.{digits}f}")


def _scalars(run: Path) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, dict[int, float]] = {}
    for events in sorted((run / "tensorboard").glob("events.out.tfevents.*")):
        ea = EventAccumulator(str(events), size_guidance={"scalars": 0})
        ea.Reload()
        for tag in ea.Tags()["scalars"]:
            out.setdefault(tag, {}).update({e.step: e.value for e in ea.Scalars(tag)})
    return {tag: [v for _, v in sorted(s.items())] for tag, s in out.items()}


def training_gains(run: Path) -> dict[str, float]:
    """Last 20% of steps minus first 20%, for the reward and its two parts; first-step scoring validity;
    the mean over steps of the evaluator's score gap between valid and invalid reports, and of the share of
    otherwise valid reports that cite an id they never retrieved; the per-step curves (for the figure)."""
    sc = _scalars(run)
    out: dict = {"curves": {tag: sc.get(tag, []) for tag in TRAIN_TAGS}}
    for tag in TRAIN_TAGS:
        vals = sc.get(tag, [])
        n = max(1, round(0.2 * len(vals)))
        out[tag] = mean(vals[-n:]) - mean(vals[:n]) if vals else math.nan
    out["first_scoring_valid_rate"] = sc.get("evaluator/scoring_valid_rate", [math.nan])[0]
    gaps = [v for v in sc.get("evaluator/score_gap_valid_invalid", []) if math.isfinite(v)]
    out["score_gap_mean"] = mean(gaps) if gaps else math.nan  # do the evaluator's scores follow validity?
    ungrounded = [v for v in sc.get("solver/ungrounded_citation_rate", []) if math.isfinite(v)]
    out["ungrounded_mean"] = mean(ungrounded) if ungrounded else math.nan
    return out


def _run(cmd: list[str], log: Path) -> None:
    t0 = time.time()
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}, {time.time() - t0:.0f}s): {shlex.join(cmd)}; log: {log}")


def card_for(model: Path, out: Path, budgets_of: Path | None = None) -> dict:
    """Generate on the held-out queries (greedy) and score them. A run's export brings its own settings
    (``run_config.json``: budgets, prompt, reward rule); the cold-start model takes those of ``budgets_of``
    (a run's export): every card in one table is generated under the same settings."""
    from score_lightning.evaluation.card import load_card
    from score_lightning.evaluation.settings import RUN_CONFIG

    arts = out / "heldout.jsonl"
    flags = ["--temperature", "0"]  # this table's protocol: greedy, one sample per query
    if budgets_of is not None:
        if not (budgets_of / RUN_CONFIG).is_file():
            raise SystemExit(f"no run_config.json in {budgets_of}: cannot match the cold start's settings")
        flags += ["--run-config", str(budgets_of / RUN_CONFIG)]
    if not (out / "heldout.card.json").exists():
        _run([sys.executable, "scripts/evaluate.py", "--model", str(model), "--queries", "embedded", "--split",
              "heldout", "--out", str(arts), "--no-progress", *flags], out / "generate.log")
        _run([sys.executable, "scripts/evaluate.py", "card", "--articles", str(arts)], out / "card.log")
    summary = load_card(out / "heldout.card.json")["summary"]  # older cards' "validity" reads as format_valid
    return {m: summary[CARD_KEYS.get(m, m)]["mean"] for m in CARD}


def run_cell(cond: str, seed: int, steps: int, out: Path) -> dict:
    """Train one (condition, seed) and card its export; cached in ``result.json``."""
    run = out / cond / f"seed{seed}"
    done = run / "result.json"
    if done.exists():
        return json.loads(done.read_text())
    run.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "src/train.py", *CONDITIONS[cond], f"seed={seed}", f"trainer.max_steps={steps}",
          f"paths.output_dir={run}", "trainer.enable_progress_bar=false"], run / "train.log")
    ckpt = __import__("torch").load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    result = {"condition": cond, "seed": seed, "steps": steps, "train": training_gains(run),
              "heldout": card_for(run / "export", run), "cold_start_model": ckpt["hyper_parameters"]["model_path"]}
    done.write_text(json.dumps(result, indent=1))
    return result


def _export_of(result: dict, out: Path, merged: list[str] | None) -> Path:
    """The export folder of a result's run (under ``--out`` or one of the ``--merge`` dirs)."""
    for root in [out, *map(Path, merged or [])]:
        export = root / result["condition"] / f"seed{result['seed']}" / "export"
        if export.is_dir():
            return export
    raise SystemExit(f"no export for {result['condition']}:{result['seed']} under {out} or {merged}")


def _budgets_of(result: dict, out: Path, merged: list[str] | None) -> dict:
    from score_lightning.evaluation import _run_budgets

    return _run_budgets(str(_export_of(result, out, merged)))


def load_results(dirs: list[Path]) -> list[dict]:
    """Every cell's ``result.json`` below ``dirs``, each file once (``--out`` may also be a ``--merge`` dir).

    Two different files for one condition and seed are refused: pooled twice, a cell would narrow every
    interval (the table keys cells by condition and seed; the figure and the summary count rows).
    """
    files = sorted({p.resolve() for d in dirs for p in d.rglob("result.json")})
    cells: dict[tuple[str, int], Path] = {}
    results = []
    for path in files:
        r = json.loads(path.read_text())
        key = (r["condition"], r["seed"])
        if key in cells:
            raise SystemExit(f"two results for {key[0]}:{key[1]}: {cells[key]} and {path}; merge one of them")
        cells[key] = path
        results.append(r)
    return results


def table(results: list[dict], baseline_card: dict, conditions: list[str]) -> str:
    by = {(r["condition"], r["seed"]): r for r in results}
    seeds = sorted({r["seed"] for r in results})
    head = ("| condition | seeds | reward gain | validity-part gain | score-part gain | score gap valid − invalid | "
            "ungrounded citation rate | Δ citation precision | Δ coverage | Δ validity | Δ length | "
            "paired Δ reward gain vs score | paired Δ citation precision vs score |")
    lines = [head, "|" + " --- |" * 13]
    for cond in conditions:
        rows = [by[(cond, s)] for s in seeds if (cond, s) in by]
        if not rows:
            continue
        delta = {m: [r["heldout"][m] - baseline_card[m] for r in rows] for m in CARD}
        paired_r, paired_c = [], []
        for r in rows:
            ref = by.get(("score", r["seed"]))
            if ref is not None and cond != "score":
                paired_r.append(r["train"]["solver/reward_mean"] - ref["train"]["solver/reward_mean"])
                paired_c.append(r["heldout"]["citation_precision"] - ref["heldout"]["citation_precision"])
        lines.append(" | ".join([
            f"| {cond}", str(len(rows)), fmt([r["train"]["solver/reward_mean"] for r in rows]),
            fmt([r["train"]["solver/reward_validity_part"] for r in rows]),
            fmt([r["train"]["solver/reward_score_part"] for r in rows]),
            fmt([r["train"].get("score_gap_mean", math.nan) for r in rows]),
            fmt([r["train"].get("ungrounded_mean", math.nan) for r in rows]),
            *(fmt(delta[m], 1 if m == "length" else 3) for m in CARD),
            fmt(paired_r) if paired_r else "-", fmt(paired_c) if paired_c else "-"]) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conditions", default=DEFAULT, help=f"comma list of {sorted(CONDITIONS)}")
    ap.add_argument("--modes", default=None, help="alias of --conditions (rubric methods, solver workflows)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[21, 22, 23, 24, 25],
                    help="fresh seeds (never tuned on; 11-15 were used by earlier studies)")
    ap.add_argument("--tuning-seeds", type=int, nargs="*", default=[], help="seeds the settings were tuned on (own table)")
    ap.add_argument("--steps", type=int, default=40, help="SCORE steps per run, fixed before running")
    ap.add_argument("--out", default=str(ROOT / "logs" / "bench_learning"))
    ap.add_argument("--only", default=None, help="run one cell CONDITION:SEED and stop (one machine of many)")
    ap.add_argument("--merge", nargs="*", default=None, help="read result.json files below these dirs; train nothing")
    ap.add_argument("--no-append", action="store_true", help="print the table; leave docs/BENCHMARKS.md alone")
    ap.add_argument("--figure", default=None, help="write a PNG: per condition, the training curves with a 95%% band "
                    "over seeds and the held-out card's changes with 95%% intervals (needs matplotlib: the bench extra)")
    args = ap.parse_args()
    conditions = [c for c in (args.modes or args.conditions).split(",") if c]
    unknown = [c for c in conditions if c not in CONDITIONS]
    if unknown:
        ap.error(f"unknown condition(s) {unknown}; allowed {sorted(CONDITIONS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    if args.only:
        cond, seed = args.only.split(":")
        print(json.dumps(run_cell(cond, int(seed), args.steps, out)))
        return 0
    if args.merge is not None:
        results = load_results([out, *map(Path, args.merge)])
        results = [r for r in results if r["condition"] in conditions and r["seed"] in args.seeds + args.tuning_seeds]
    else:
        results = [run_cell(c, s, args.steps, out) for s in args.seeds + args.tuning_seeds for c in conditions]
    if not results:
        raise SystemExit("no results")
    cold = out / "cold_start"
    cold.mkdir(exist_ok=True)
    budgets = {json.dumps(_budgets_of(r, out, args.merge), sort_keys=True) for r in results}
    if len(budgets) != 1:
        raise SystemExit(f"the runs differ in solver budgets ({sorted(budgets)}); one table needs one budget")
    baseline = card_for(Path(results[0]["cold_start_model"]), cold, _export_of(results[0], out, args.merge))
    fresh = [r for r in results if r["seed"] not in args.tuning_seeds]
    tuned = [r for r in results if r["seed"] in args.tuning_seeds]
    report = [table(fresh, baseline, conditions)]
    if tuned:
        report += ["", "Tuning seeds (reported apart, not pooled):", "", table(tuned, baseline, conditions)]
    text = "\n".join(report)
    print(text)
    first_valid = [r["train"]["first_scoring_valid_rate"] for r in fresh if r["condition"] == "score"]
    summary = ("cold-start held-out card: " + ", ".join(f"{m} {baseline[m]:.3f}" for m in CARD)
               + f"; SCORE first-step evaluator/scoring_valid_rate {fmt(first_valid)} (over seeds)")
    print(summary)
    if args.figure:
        from learning_figure import draw

        draw(fresh, baseline, conditions, Path(args.figure), T975)
        print(f"figure: {args.figure}")
    if not args.no_append:
        append(text, summary, sys.argv, conditions, sorted({r["seed"] for r in fresh}), args.steps, time.time() - t0)
    return 0


def append(text: str, summary: str, argv: list[str], conditions: list[str], seeds: list[int], steps: int,
           took: float) -> None:
    import platform

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
    section = f"""

## {dt.date.today().isoformat()}: learning on held-out queries, {", ".join(conditions)}

### Command

```bash
{shlex.join(["python", "scripts/bench_learning.py", *argv[1:]])}
```

Machine: {os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), no GPU; load average
{load:.1f} at the end; {took / 60:.0f} minutes in all. Seeds {seeds} (fresh: no setting was tuned on
them), {steps} SCORE steps each, the shared cached cold start. Every cell is mean ± half-width of the 95%
t-interval over seeds. Reward gains: last 20% of steps minus first 20%. Δ: the final export's held-out
card minus the cold-start model's card (20 held-out queries, greedy). Paired Δ: the condition minus
SCORE on the same seed. Score gap: the mean over steps of `evaluator/score_gap_valid_invalid` (the
evaluator's Σ w s of valid minus invalid reports; n/a for results recorded before that tag existed).

{text}

{summary}
"""
    with open(ROOT / "docs" / "BENCHMARKS.md", "a", encoding="utf-8") as fh:
        fh.write(section)


if __name__ == "__main__":
    sys.exit(main())
