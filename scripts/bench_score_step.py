"""What a SCORE step costs beyond plain GRPO: ``experiment=tiny_score`` vs ``experiment=grpo_baseline``, phase by phase.

    HF_HUB_OFFLINE=1 python scripts/bench_score_step.py [--reps 10] [--warmup 1] [--rollout hf|scripted]

Both sides are real training runs (``score_lightning.launch.training.run``: the project's Hydra config,
DataModule, callbacks, TensorBoard logger and checkpointing), from the same cold-start checkpoint,
with the same K, batch, budgets, optimiser and seed; ``grpo_baseline`` differs only in what it is:
a static rubric, no evaluator REINFORCE, no meta-harness. Its reports are still scored by the
evaluator role (the reward needs scores). Each side runs in its own subprocess with ``--threads``
torch threads; the parent alternates their steps (A B B A ...), so only one computes at a time.

A step runs from one ``on_train_batch_start`` to the next (or to ``on_train_end``): the training
step, the callbacks (checkpoint every ``callbacks.model_checkpoint.every_n_steps``, meta-harness every
``harness.every_n_steps``), logging and the next batch. Phases are timed by wrapping the stage
functions ``ScoreModule`` calls (``score_lightning.module``'s names), the scalar reduction and logging
methods, ``Trainer.save_checkpoint`` and the meta-harness hook; "other" is the rest.

``--rollout hf`` (default) samples with the real HF engine after the cold start (``sft.enabled``,
cached under ``paths.cache_dir``; the parent builds it once), so the times include real generation
and real verification searches. ``--rollout scripted`` replays the deterministic protocol text instead
(no cold start needed): the model still computes every log-prob and update, but generation is free.

``score_overhead`` is the median over repetitions of SCORE step / GRPO step, each pair run back to
back (robust to load spikes on a shared machine); the ratio of the mean step times, which weighs the
periodic checkpoint and harness refresh in, is printed beside it. Equal work: the script refuses the ratio unless both configs agree on
every budget key (``BUDGET_KEYS``), both start from the same checkpoint and both saw the same queries
at every step. The last line is ``score_overhead=X equal_work=ok``.
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common as bc  # noqa: E402

SIDES = {"score": "tiny_score", "grpo": "grpo_baseline"}
PHASES = ("evidence", "rubric", "solver_rollouts", "scoring", "rewards", "grpo_update", "reinforce_update",
          "harness", "logging", "checkpoint", "other")
#: config keys that must be equal on both sides (same K, batch and budgets)
BUDGET_KEYS = ("solver.num_rollouts", "data.batch_size", "solver.max_response_tokens", "solver.max_tool_calls",
               "solver.max_prompt_tokens", "solver.max_observation_tokens", "solver.topk", "evaluator.max_tool_calls",
               "evaluator.max_response_tokens", "evaluator.max_report_tokens", "optim.mini_batch_size",
               "optim.micro_batch_size", "optim.ppo_epochs", "optim.lr", "loss.kl_coef", "model.dtype", "seed",
               "callbacks.model_checkpoint.every_n_steps", "logging.text_every_n_steps")
#: (name in ``score_lightning.module``, phase): the stage functions as ``ScoreModule`` calls them. The
#: step is being refactored: a name the module no longer has is reported (its time falls into "other").
MODULE_WRAPS = (("initial_evidence", "evidence"), ("solver_rollouts", "solver_rollouts"),
                ("scoring_rollouts", "scoring"), ("parse_answers", "rewards"), ("assemble_rewards", "rewards"),
                ("sample_rewards", "rewards"), ("centre", "rewards"), ("solver_update", "grpo_update"),
                ("evaluator_update", "reinforce_update"), ("record_step", "logging"),
                ("record_solver_update", "logging"))


def overrides(a, side: str, out: str) -> list[str]:
    o = [f"experiment={SIDES[side]}", f"trainer.max_steps={a.warmup + a.reps}", f"paths.output_dir={out}",
         "trainer.enable_progress_bar=false",
         "callbacks.collapse_guard.enabled=false",  # a guard stop would end one side early
         f"rollout={a.rollout}"]
    return o + (["sft.enabled=false"] if a.rollout == "scripted" or a.no_cold_start else [])


class PhaseTimer:
    """Accumulates wall time per phase for the current step; nested phases count once, in the outer one."""

    def __init__(self) -> None:
        self.current: dict[str, float] = defaultdict(float)
        self._depth = 0

    def wrap(self, owner, name: str, phase: str) -> bool:
        """Time ``owner.name`` as ``phase``; False (nothing wrapped) when ``owner`` has no such attribute."""
        fn = getattr(owner, name, None)
        if fn is None:
            return False

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            self._depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.current[phase] += time.perf_counter() - t0

        setattr(owner, name, timed)
        return True

    def take(self) -> dict[str, float]:
        out, self.current = dict(self.current), defaultdict(float)
        return out


def _tokens(module) -> dict:
    ro = module.last_step["rollouts"] if module.last_step else None
    if ro is None:
        return {}
    return {"rubric_tokens": sum(s.num_tokens for s, _ in ro.rubrics.samples),
            "solver_tokens": sum(t.num_model_tokens for t in ro.solver),
            "scoring_tokens": sum(t.num_model_tokens for t in ro.scoring),
            "solver_searches": sum(t.tool_calls for t in ro.solver),
            "scoring_searches": sum(t.tool_calls for t in ro.scoring)}


def worker(a) -> None:
    proto = bc.Proto()
    bc.set_threads(a.threads)
    import lightning.pytorch as pl

    import score_lightning.module as M
    from score_lightning.callbacks.meta_harness import MetaHarnessCallback
    from score_lightning.step.scalars import StepScalars
    from score_lightning.launch.training import run

    timer = PhaseTimer()
    missing = [name for name, phase in MODULE_WRAPS if not timer.wrap(M, name, phase)]
    for owner, name, phase in ((StepScalars, "compute", "logging"), (M.ScoreModule, "step_metrics", "logging"),
                               (M.ScoreModule, "log_step", "logging"),
                               (pl.Trainer, "save_checkpoint", "checkpoint"),
                               (MetaHarnessCallback, "on_train_batch_end", "harness")):
        if not timer.wrap(owner, name, phase):
            missing.append(f"{owner.__name__}.{name}")

    def hook(module) -> None:
        """The rubric stage is a configured object (``rubric=score|evolving|given``): time its method."""
        if not timer.wrap(module.rubric_source, "step_rubrics", "rubric"):
            missing.append("rubric_source.step_rubrics")
        if not timer.wrap(module.rubric_source, "observe", "rubric"):
            missing.append("rubric_source.observe")

    class StepClock(pl.Callback):
        """Reports each finished step at the next step's start, then blocks until the parent's next command."""

        t0: float | None = None
        queries = ""

        def _close(self, module) -> None:
            if self.t0 is not None:
                phases = timer.take()
                total = time.perf_counter() - self.t0
                phases["other"] = total - sum(phases.values())
                proto.send("step", time_s=total, phases=phases, queries=self.queries, rss_mb=bc.rss_mb(),
                           **_tokens(module))
                proto.wait_go()

        def on_train_start(self, trainer, module) -> None:
            proto.send("ready", model_path=str(module.model_path), rss_mb=bc.rss_mb(), unwrapped=missing)
            proto.wait_go()

        def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
            self._close(module)
            timer.take()  # nothing between steps is charged to the next one
            self.queries = bc.ids_digest([[ord(c) for c in q] for q in batch["prompt"]])
            self.t0 = time.perf_counter()

        def on_train_end(self, trainer, module) -> None:
            self._close(module)

    out = tempfile.mkdtemp(prefix=f"bench_{a.worker}_")
    threads = [f"threads.num={a.threads}"] if a.threads > 0 else []  # else the trainer's auto would reset it
    run(bc.compose(overrides(a, a.worker, out) + threads), extra_callbacks=[StepClock()], module_hook=hook)
    proto.send("done", peak_rss_mb=bc.peak_rss_mb())


def budget_problems(a) -> list[str]:
    """Budget keys whose values differ between the two composed configs."""
    from omegaconf import OmegaConf

    cfgs = {s: bc.compose(overrides(a, s, "/tmp/unused")) for s in SIDES}
    vals = {s: {k: OmegaConf.select(c, k) for k in BUDGET_KEYS} for s, c in cfgs.items()}
    return [f"{k}: score {vals['score'][k]!r} vs grpo {vals['grpo'][k]!r}" for k in BUDGET_KEYS
            if vals["score"][k] != vals["grpo"][k]]


def prepare_cold_start(a) -> None:
    """Build (or find cached) the cold-start checkpoint once, before two workers could race for it."""
    if a.rollout == "scripted" or a.no_cold_start:
        return
    from score_lightning.launch.training import maybe_run_sft, resolve_model_path

    for side in SIDES:
        cfg = bc.compose(overrides(a, side, tempfile.mkdtemp(prefix="bench_sft_")))
        t0 = time.perf_counter()
        path = maybe_run_sft(cfg, resolve_model_path(cfg))
        print(f"cold start for {side}: {path} ({time.perf_counter() - t0:.0f} s)", flush=True)


def report(a, steps: dict[str, list[dict]], ready: dict[str, dict]) -> float | None:
    """Prints the phase table; returns score_overhead, or None when an equal-work check failed."""
    timed = {s: [r for r in rs if r["rep"] >= 0] for s, rs in steps.items()}
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    print(f"\nOne SCORE step vs one GRPO-baseline step (rollout={a.rollout}), means (and medians) over {a.reps} "
          f"alternating steps after {a.warmup} warm-up, {a.threads} torch thread(s) per side\n")
    print("| phase | tiny_score (s) | grpo_baseline (s) | SCORE − GRPO (s) | share of SCORE step |")
    print("|---|---|---|---|---|")
    total = {s: mean([r["time_s"] for r in timed[s]]) for s in SIDES}
    for ph in PHASES:
        m = {s: mean([r["phases"].get(ph, 0.0) for r in timed[s]]) for s in SIDES}
        print(f"| {ph} | {m['score']:.3f} | {m['grpo']:.3f} | {m['score'] - m['grpo']:+.3f} "
              f"| {100 * m['score'] / total['score']:.0f}% |")
    med = {s: bc.median([r["time_s"] for r in timed[s]]) for s in SIDES}
    spreads = {s: bc.spread([r["time_s"] for r in timed[s]]) for s in SIDES}
    print(f"| **step** | **{total['score']:.3f}** (median {med['score']:.3f}, {spreads['score']}) "
          f"| **{total['grpo']:.3f}** (median {med['grpo']:.3f}, {spreads['grpo']}) "
          f"| {total['score'] - total['grpo']:+.3f} | 100% |\n")
    print("| per step (means) | tiny_score | grpo_baseline |\n|---|---|---|")
    for key in ("rubric_tokens", "solver_tokens", "scoring_tokens", "solver_searches", "scoring_searches"):
        print(f"| {key} | {mean([r.get(key, 0) for r in timed['score']]):.1f} "
              f"| {mean([r.get(key, 0) for r in timed['grpo']]):.1f} |")
    problems = budget_problems(a)
    if ready["score"]["model_path"] != ready["grpo"]["model_path"]:
        problems.append(f"start checkpoints differ: {ready['score']['model_path']} vs {ready['grpo']['model_path']}")
    problems += [f"step {i}: different queries" for i, (x, y) in enumerate(zip(steps["score"], steps["grpo"]))
                 if x["queries"] != y["queries"]]
    ratios = [x["time_s"] / y["time_s"] for x, y in zip(timed["score"], timed["grpo"])]
    print("\nper-repetition ratios SCORE/GRPO (adjacent steps): " + ", ".join(f"{r:.3f}" for r in ratios)
          + f"; ratio of the means {total['score'] / total['grpo']:.3f}")
    print("equal work: " + ("same budgets (" + ", ".join(BUDGET_KEYS) + "), same start checkpoint, same queries "
                            "every step" if not problems else "FAILED\n  " + "\n  ".join(problems)))
    return None if problems else bc.median(ratios)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=10, help="timed steps per side (10: one checkpoint, two refreshes)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rollout", choices=("hf", "scripted"), default="hf")
    p.add_argument("--no-cold-start", action="store_true",
                   help="HF rollouts from the raw tiny model (sft.enabled=false): no valid rubric or answer, no "
                        "searches, every generation runs to its token budget")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--worker", choices=tuple(SIDES), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        return worker(a)
    print(bc.machine_line(), flush=True)
    bc.set_threads(a.threads)  # the cold start too: spinning OpenMP threads stall on a shared machine
    prepare_cold_start(a)
    print(f"before: {bc.load_line()}", flush=True)
    opts = [f"--reps={a.reps}", f"--warmup={a.warmup}", f"--rollout={a.rollout}", f"--threads={a.threads}"]
    opts += ["--no-cold-start"] if a.no_cold_start else []
    workers = {s: bc.Worker([sys.executable, __file__, "--worker", s, *opts], s, bc.bench_env()) for s in SIDES}

    def show(name, tag, r):
        print(f"  {tag:10s} {name:5s} {r['time_s']:7.3f} s  " + ", ".join(
            f"{k} {v:.2f}" for k, v in r["phases"].items() if v >= 0.01), flush=True)

    try:
        ready = {s: w.expect("ready") for s, w in workers.items()}
        for s, r in ready.items():
            if r["unwrapped"]:
                print(f"  note: {s}: not in this ScoreModule, so counted in 'other': {', '.join(r['unwrapped'])}")
        steps = bc.alternate(workers, a.warmup + a.reps, a.warmup, show)
        for w in workers.values():
            w.finish()
    finally:
        for w in workers.values():
            w.kill()
    overhead = report(a, steps, ready)
    print(f"after: {bc.load_line()}")
    print(bc.summary_line(score_overhead=overhead, equal_work="ok" if overhead is not None else "FAILED"))
    if overhead is None:
        sys.exit(1)


if __name__ == "__main__":
    main()
