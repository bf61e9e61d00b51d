#!/usr/bin/env python
"""Where a SCORE step's time, memory and page faults go, stage by stage, on any experiment and model.

    OMP_NUM_THREADS=1 python scripts/profile_step.py experiment=smol_score --steps 6
    OMP_NUM_THREADS=1 python scripts/profile_step.py experiment=tiny_score model=smollm2_135m sft.enabled=false

Runs the real trainer (``training.run``: config, cold start, ScoreModule, Lightning) for ``--steps``
SCORE steps and wraps each stage: the rubric, the solver rollouts, scoring, and inside the solver
update the no-grad log-prob passes (old policy, reference), the forward with gradient, the backward
and the optimiser step, then the evaluator update. A sampler thread reads the process RSS every
10 ms; per stage it reports wall time, the peak RSS while the stage ran and the minor page faults it
caused (``getrusage``). The last line is ``key=value``: the median step time over the steps after
the first, the peak RSS over all steps, and the median split.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import resource
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))
import bench_common as bc  # noqa: E402


class StageMeter:
    """Nested stage labels; per label, summed time, exact peak RSS and minor faults of the current step.

    Peaks come from the kernel's high-water mark (``VmHWM``), reset at every stage boundary and folded
    into every stage open at that moment, so short spikes (one ``[rows, T, V]`` block) are not missed.
    """

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.peak: dict[str, float] = defaultdict(float)
        self.time: dict[str, float] = defaultdict(float)
        self.faults: dict[str, int] = defaultdict(int)
        self.steps: list[dict] = []

    def _fold(self) -> None:
        hwm = bc.peak_rss_since_reset_mb()
        for label in self.stack:
            self.peak[label] = max(self.peak[label], hwm)
        bc.reset_peak_rss()

    @contextlib.contextmanager
    def stage(self, label: str):
        self._fold()
        self.stack.append(label)
        f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        try:
            yield
        finally:
            self.time[label] += time.perf_counter() - t0
            self.faults[label] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
            self._fold()
            self.stack.pop()

    def wrap(self, label: str, fn):
        @functools.wraps(fn)
        def inner(*a, **k):
            with self.stage(label):
                return fn(*a, **k)
        return inner

    def end_step(self) -> dict:
        rec = {"time": dict(self.time), "peak": dict(self.peak), "faults": dict(self.faults)}
        self.steps.append(rec)
        self.time, self.peak, self.faults = defaultdict(float), defaultdict(float), defaultdict(int)
        return rec


ORDER = ("step", "rubric", "solver rollouts", "scoring", "solver update", "  old/ref log-probs", "  forward (grad)",
         "  backward", "  optimiser", "evaluator update")


def instrument(meter: StageMeter, patch=setattr) -> None:
    """Wrap the stage functions where the step looks them up (``patch``: ``setattr``, or a test's ``monkeypatch``).

    ``ScoreModule.training_step`` calls the evaluator update and the solver objective (``step/solver_objective.py``,
    whose ``grpo`` entry looks ``solver_update`` up there); the generating stages are the ``Generator`` of
    ``generation/generator.py``, which look up ``solver_rollouts`` there; the solver update's log-prob passes are
    looked up in ``step/solver_update.py``.
    """
    import torch

    import score_lightning.module as M
    import score_lightning.generation.generator as G
    import score_lightning.step.solver_objective as SO
    import score_lightning.step.solver_update as SU

    patch(G, "solver_rollouts", meter.wrap("solver rollouts", G.solver_rollouts))
    patch(SO, "solver_update", meter.wrap("solver update", SO.solver_update))
    patch(M, "evaluator_update", meter.wrap("evaluator update", M.evaluator_update))
    patch(SU, "chunked_logprobs", meter.wrap("  old/ref log-probs", SU.chunked_logprobs))
    plain, timed = SU.policy_logprobs, meter.wrap("  forward (grad)", SU.policy_logprobs)
    patch(SU, "policy_logprobs", lambda *a, **k: (timed if torch.is_grad_enabled() else plain)(*a, **k))  # no-grad: old/ref
    score, hooks, training_step = G.Generator.score, M.ScoreModule.optimizer_hooks, M.ScoreModule.training_step
    patch(G.Generator, "score", lambda self, ro: meter.wrap("scoring", score)(self, ro))  # module.score is its generator's

    def _hooks(self, phase, model):
        h = hooks(self, phase, model)
        h.backward, h.step = meter.wrap("  backward", h.backward), meter.wrap("  optimiser", h.step)
        return h

    patch(M.ScoreModule, "optimizer_hooks", _hooks)

    def step(self, batch, batch_idx):
        if not getattr(self.rubric_source, "_profiled", False):
            self.rubric_source.step_rubrics = meter.wrap("rubric", self.rubric_source.step_rubrics)
            self.rubric_source._profiled = True
        with meter.stage("step"):
            out = training_step(self, batch, batch_idx)
        rec = meter.end_step()
        m = self.last_step["metrics"] if self.last_step else {}
        print("  " + "; ".join(f"{k.strip()} {rec['time'][k]:.1f} s / {rec['peak'][k]:.0f} MiB / {rec['faults'][k] / 1e6:.2f} M"
                               for k in ORDER[1:] if k in rec["time"]), flush=True)
        print(f"step {len(meter.steps) - 1}: {rec['time']['step']:.1f} s, peak RSS {rec['peak']['step']:.0f} MiB, "
              f"{rec['faults']['step'] / 1e6:.2f} M minor faults; logged time/rollout_s {m.get('time/rollout_s', 0):.1f} "
              f"scoring_s {m.get('time/scoring_s', 0):.1f} update_s {m.get('time/update_s', 0):.1f}; {bc.load_line()}",
              flush=True)
        return out

    patch(M.ScoreModule, "training_step", step)


def report(meter: StageMeter, warm: list[dict]) -> dict:
    print("\n| stage | median time (s) | median peak RSS (MiB) | median minor faults (M) |")
    print("|---|---|---|---|")
    for label in ORDER:
        if not any(label in s["time"] for s in warm):
            continue
        med = lambda key: statistics.median(s[key].get(label, 0.0) for s in warm)  # noqa: E731
        print(f"| {label} | {med('time'):.1f} | {med('peak'):.0f} | {med('faults') / 1e6:.2f} |")
    return {"step_s_median": statistics.median(s["time"]["step"] for s in warm),
            "peak_rss_mb": max(s["peak"]["step"] for s in meter.steps),
            **{key: statistics.median(s["time"].get(label, 0.0) for s in warm)
               for key, label in (("rollouts_s", "solver rollouts"), ("scoring_s", "scoring"),
                                  ("update_s", "solver update"))}}


def main(argv: list[str] | None = None, patch=setattr) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3, help="SCORE steps; the first is reported but not in the medians")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. experiment=smol_score")
    a = ap.parse_args(argv)
    from score_lightning.launch.training import run

    print(bc.machine_line(), flush=True)
    meter = StageMeter()
    instrument(meter, patch)
    out = [] if any(o.startswith("paths.output_dir=") for o in a.overrides) else \
        [f"paths.output_dir={ROOT / 'logs' / 'profile_step' / time.strftime('%Y%m%d-%H%M%S')}"]
    cfg = bc.compose([*a.overrides, f"trainer.max_steps={a.steps}", "trainer.enable_progress_bar=false",
                      "logger=csv", *out])
    t0 = time.perf_counter()
    run(cfg, module_hook=lambda m: print(f"model ready: RSS {bc.rss_mb():.0f} MiB after {time.perf_counter() - t0:.0f} s",
                                         flush=True))
    warm = meter.steps[1:] or meter.steps
    res = report(meter, warm)
    print(f"after: {bc.load_line()}")
    print(bc.summary_line(steps=len(meter.steps), **res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
