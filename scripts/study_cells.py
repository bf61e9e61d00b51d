"""One cell of a learning study (a condition and a seed): training in chunks, its curves, its slope.

``scripts/bench_learning.py`` calls these. A cell trains to each horizon in turn, resuming the same run
folder from its ``checkpoints/last.ckpt``, and keeps the export of every horizon
(``export_s<steps>/``), so one run gives the held-out metric at 80, 160 and 240 steps, and a study can
be run in parts: a cell that stopped resumes at its last finished horizon.
"""

from __future__ import annotations

import math
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from statistics import mean, median

ROOT = Path(__file__).resolve().parents[1]
TRAIN_TAGS = ("solver/reward_mean", "solver/reward_validity_part", "solver/reward_score_part")
#: a method's own health, averaged over its steps: the rubric writers' failures and buffer sizes (RLER,
#: DR-rubric), the step and stage judges' parse rates (ARCO, RubricEM), the workflows' invalid actions (MaMs)
HEALTH_TAGS = {"write_fail_mean": "rubric/write_fail_rate", "items_per_query_mean": "rubric/buffer_size",
               "step_judge_valid_mean": "evaluator/step_rubric_valid_rate",
               "stage_judge_valid_mean": "stage/judge_valid_rate", "invalid_actions_mean": "rollout/invalid_actions",
               "evaluator_valid_pair_acc_mean": "evaluator/valid_pair_acc"}
STEP_TIME_TAGS = ("time/rollout_s", "time/scoring_s", "time/update_s")


def run_logged(cmd: list[str], log: Path, threads: int | None = None) -> None:
    """Run ``cmd`` from the repository root, its output to ``log``; a failure stops the study, naming both."""
    t0 = time.time()
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    if threads is not None:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    with open(log, "a") as fh:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}, {time.time() - t0:.0f}s): {shlex.join(cmd)}; log: {log}")


def guard_stop(run: Path) -> int | None:
    """The SCORE step at which the collapse guard stopped this run, read from its last checkpoint (the guard keeps
    ``stopped_step`` in its state); None when it has not stopped it, or there is no checkpoint yet."""
    last = run / "checkpoints" / "last.ckpt"
    if not last.is_file():
        return None
    import torch

    ckpt = torch.load(last, map_location="cpu", weights_only=False)
    for key, state in (ckpt.get("callbacks") or {}).items():
        if str(key).startswith("CollapseGuard") and isinstance(state, dict) and state.get("stopped_reason"):
            return int(state.get("stopped_step") or 0)
    return None


def train_horizons(overrides: list[str], seed: int, horizons: list[int], run: Path,
                   threads: int | None = None) -> dict[int, Path]:
    """Train to each horizon in turn (resuming), keeping ``export_s<h>``; returns horizon -> export folder.

    A run the collapse guard stopped stays stopped, as the recipe intends: every later horizon keeps the export of
    the step it stopped at (resuming from its checkpoint would train past the stop)."""
    run.mkdir(parents=True, exist_ok=True)
    exports: dict[int, Path] = {}
    for h in sorted(horizons):
        kept = run / f"export_s{h}"
        if not (kept / "run_config.json").is_file():
            last = run / "checkpoints" / "last.ckpt"  # ckpt_path=last would look under logs/<task>/, not here
            stopped = guard_stop(run)
            if stopped is None:
                resume = [f"ckpt_path={last}"] if last.is_file() else []
                run_logged([sys.executable, "src/train.py", *overrides, f"seed={seed}", f"trainer.max_steps={h}",
                            f"paths.output_dir={run}", "trainer.enable_progress_bar=false", *resume],
                           run / "train.log", threads)
            else:
                with open(run / "train.log", "a") as fh:
                    fh.write(f"study: the collapse guard stopped this run at step {stopped}; the {h}-step horizon "
                             "keeps that export\n")
            if kept.exists():
                shutil.rmtree(kept)
            shutil.copytree(run / "export", kept)
        exports[h] = kept
    return exports


def scalars(run: Path) -> dict[str, list[float]]:
    """Every scalar of a run's TensorBoard events, by step (a resumed run's files merged, later wins)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, dict[int, float]] = {}
    for events in sorted((run / "tensorboard").rglob("events.out.tfevents.*")):
        ea = EventAccumulator(str(events), size_guidance={"scalars": 0})
        ea.Reload()
        for tag in ea.Tags()["scalars"]:
            out.setdefault(tag, {}).update({e.step: e.value for e in ea.Scalars(tag)})
    return {tag: [v for _, v in sorted(s.items())] for tag, s in out.items()}


def slope(values: list[float]) -> float:
    """Least-squares slope of ``values`` against their step index (per step; NaN with fewer than 2 finite)."""
    pts = [(i, v) for i, v in enumerate(values) if math.isfinite(v)]
    if len(pts) < 2:
        return math.nan
    mx, my = mean(i for i, _ in pts), mean(v for _, v in pts)
    sxx = sum((i - mx) ** 2 for i, _ in pts)
    return sum((i - mx) * (v - my) for i, v in pts) / sxx


def training_summary(run: Path) -> dict:
    """The reward's slope over all steps (per 100 steps) and last-20%-minus-first-20% gains of the reward and
    its parts; the first step's scoring validity; the mean score gap, ungrounded rate and within-group
    informative share; the curves (for the figure)."""
    sc = scalars(run)
    out: dict = {"curves": {tag: sc.get(tag, []) for tag in TRAIN_TAGS}}
    for tag in TRAIN_TAGS:
        vals = sc.get(tag, [])
        n = max(1, round(0.2 * len(vals)))
        out[tag] = mean(vals[-n:]) - mean(vals[:n]) if vals else math.nan
    out["reward_slope"] = 100.0 * slope(sc.get("solver/reward_mean", []))
    out["validity_slope"] = 100.0 * slope(sc.get("solver/reward_validity_part", []))
    out["first_scoring_valid_rate"] = sc.get("evaluator/scoring_valid_rate", [math.nan])[0]
    for key, tag in (("score_gap_mean", "evaluator/score_gap_valid_invalid"),
                     ("ungrounded_mean", "solver/ungrounded_citation_rate"),
                     ("zero_variance_mean", "solver/zero_variance_group_rate"),
                     ("draws_mean", "solver/sampling_draws"),
                     ("rank_tau_mean", "evaluator/rank_tau_valid"),
                     # off-policy statistics of asynchronous rollouts (NaN for a synchronous HF run)
                     ("staleness_mean", "rollout/staleness_mean"),
                     ("is_weight_mean", "rollout/is_weight_mean"),
                     ("is_clipped_mean", "rollout/is_clipped_frac"),
                     ("mismatch_kl_mean", "rollout/mismatch_kl")):
        vals = [v for v in sc.get(tag, []) if math.isfinite(v)]
        out[key] = mean(vals) if vals else math.nan
    # each method's own health (NaN where the method does not log it) and what a step costs
    for key, tag in HEALTH_TAGS.items():
        vals = [v for v in sc.get(tag, []) if math.isfinite(v)]
        out[key] = mean(vals) if vals else math.nan
    out["seconds_per_step"] = step_seconds(sc)
    out["steps"] = len(sc.get("solver/reward_mean", []))
    return out


def step_seconds(sc: dict[str, list[float]]) -> float:
    """Median wall seconds of a step: rollout + scoring + update, as the step logs them (NaN without them)."""
    parts = [sc.get(tag, []) for tag in STEP_TIME_TAGS]
    n = min((len(p) for p in parts), default=0)
    totals = sorted(sum(p[i] for p in parts) for i in range(n))
    return median(totals) if totals else math.nan


def run_in_lanes(cells: list[tuple[str, int]], lanes: int, command_of, log_dir: Path,
                 threads: int) -> list[str]:
    """Run each cell as its own process (``command_of(condition, seed)``), ``lanes`` at a time, in the given
    order (seed-major: a study cut short holds whole seeds); each process gets ``threads`` torch threads so the
    lanes never oversubscribe the machine. Returns the failed cells, each with its log; a failure does not stop
    the other lanes (its cell reruns, and resumes, next time)."""
    from concurrent.futures import ThreadPoolExecutor

    log_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))

    def one(cell: tuple[str, int]) -> str | None:
        cond, seed = cell
        log = log_dir / f"{cond}_seed{seed}.lane.log"
        t0 = time.time()
        print(f"lane: start {cond}:{seed} at {time.strftime('%Y-%m-%d %H:%M:%S')}", flush=True)
        with open(log, "a") as fh:
            code = subprocess.run(command_of(cond, seed), cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                                  env=env).returncode
        print(f"lane: end {cond}:{seed} rc={code} after {time.time() - t0:.0f} s at {time.strftime('%H:%M:%S')}",
              flush=True)
        return None if code == 0 else f"{cond}:{seed} (exit {code}; log: {log})"

    with ThreadPoolExecutor(max_workers=max(1, lanes)) as pool:
        return [f for f in pool.map(one, cells) if f is not None]


def evaluator_pairs(pair_set: Path | None, overrides: list[str], out: Path, model: Path | None = None,
                    threads: int | None = None) -> dict[str, float]:
    """The recipe's evaluator on a stored pair set (``scripts/bench_evaluator.py --pair-set``, scoring seed 1),
    or with ``pair_set`` None on the pairs of the held-out reports the model itself writes (``--seed 1``, the
    script's defaults): ``model`` an export, or None for the recipe's own cold start. The parsed last line, cached
    in ``out``."""
    import json

    done = out / "evaluator_pairs.json"
    if done.is_file():
        return json.loads(done.read_text())
    if model is not None and not any((model / f).is_file() for f in ("config.json", "adapter_config.json")):
        raise SystemExit(f"the export {model} is not on this machine (logs/ did not survive?): train the cell again "
                         "to read its evaluator")
    out.mkdir(parents=True, exist_ok=True)
    log = out / "bench_evaluator.log"
    run_logged([sys.executable, "scripts/bench_evaluator.py", "--seed", "1",
                *(["--pair-set", str(pair_set)] if pair_set is not None else []),
                "--out", str(out), *(["--model", str(model)] if model is not None else []), *overrides], log, threads)
    values = parse_summary_line(log.read_text().strip().splitlines()[-1])
    done.write_text(json.dumps(values, indent=1))
    return values


def relative(path: Path, root: Path = ROOT) -> str:
    """A path as the archive keeps it: relative to the repository (``root``) when inside it, else absolute."""
    path = path.resolve()
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def evaluator_readings(result: dict, recipe: list[str], cold_out: Path, run: Path, export: Path,
                       pair_set: Path | None, probe: bool, threads: int | None) -> None:
    """Fill ``result`` with the condition's evaluator read at its cold start and at its last export (each
    cached, each once): ``evaluator_pairs`` on the stored ``pair_set`` (the same pairs at both ends), and with
    ``probe`` ``evaluator_probe``, each model writing and scoring its own held-out reports (bench_evaluator's
    ``--seed 1`` defaults: what that model's evaluator knows about that model's reports)."""
    if pair_set is not None and not result.get("evaluator_pairs"):
        result["evaluator_pairs"] = {
            "pair_set": relative(pair_set),
            "cold_start": evaluator_pairs(pair_set, recipe, cold_out, threads=threads),
            "end": evaluator_pairs(pair_set, recipe, run / "evaluator_pairs", export, threads)}
    if probe and not result.get("evaluator_probe"):
        result["evaluator_probe"] = {
            "seed": 1,
            "cold_start": evaluator_pairs(None, recipe, cold_out / "probe", threads=threads),
            "end": evaluator_pairs(None, recipe, run / "evaluator_probe", export, threads)}


def parse_summary_line(line: str) -> dict[str, float]:
    """``key=value`` fields of a bench script's last line; intervals ``[lo,hi]`` become ``key_lo`` / ``key_hi``."""
    out: dict[str, float] = {}
    for field in line.split():
        key, _, value = field.partition("=")
        if value.startswith("[") and value.endswith("]"):
            lo, _, hi = value[1:-1].partition(",")
            out[f"{key.removesuffix('_ci')}_lo"], out[f"{key.removesuffix('_ci')}_hi"] = float(lo), float(hi)
        else:
            try:
                out[key] = float(value)
            except ValueError:
                continue
    return out
