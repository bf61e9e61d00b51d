#!/usr/bin/env python
"""What each ``evaluator.on_incomplete`` rule keeps of the learning signal, measured on the same rollouts.

    python scripts/bench_on_incomplete.py --steps 15 --seed 2 evaluator.scoring=joint

Trains ``experiment=tiny_score`` (its packaged cold start) with the overrides given, under the default rule;
at every step it also assembles that step's rewards under the other rules from the same rollouts and
evaluations, and counts per rule the groups that keep a non-zero advantage (the solver's learning signal)
and, among the groups whose evaluation was incomplete, those that still teach something. Last line:
``groups=N incomplete=M informative_validity=… informative_drop=… informative_neutral=… rescued_by_validity=…``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_common import compose  # noqa: E402

RULES = ("validity", "drop", "neutral")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--seed", type=int, default=2, help="a development seed (0-9)")
    ap.add_argument("--out", default=str(ROOT / "logs" / "bench_on_incomplete"))
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. evaluator.scoring=joint")
    args = ap.parse_args()

    from omegaconf import OmegaConf

    from score_lightning.launch.training import run
    from score_lightning.step.dynamic_sampling import informative_groups
    from score_lightning.step.reward_assembly import assemble_rewards

    counts = {r: 0 for r in RULES} | {"groups": 0, "incomplete": 0, "rescued": 0}

    def hook(module):
        plain = module.score

        def score(ro):
            rw = plain(ro)
            per = {}
            for rule in RULES:
                evaluator = OmegaConf.merge(module.cfg.evaluator, {"on_incomplete": rule})
                alt = assemble_rewards(rw.answers, ro.scoring, ro.rubrics.per_query, module.harness_state, module.K,
                                       evaluator, module.cfg.verifier, module.tokenizer)
                per[rule] = informative_groups(alt, module.K)
                counts[rule] += int(per[rule].sum())
            incomplete = rw.incomplete_groups
            counts["groups"] += len(incomplete)
            counts["incomplete"] += int(incomplete.sum())
            counts["rescued"] += int((incomplete & per["validity"]).sum())
            return rw

        module.score = score

    cfg = compose(["experiment=tiny_score", f"seed={args.seed}", f"trainer.max_steps={args.steps}",
                   f"paths.output_dir={args.out}", "trainer.enable_progress_bar=false", *args.overrides])
    run(cfg, module_hook=hook)
    g = max(1, counts["groups"])
    print(f"groups={counts['groups']} incomplete={counts['incomplete']} "
          + " ".join(f"informative_{r}={counts[r] / g:.3f}" for r in RULES)
          + f" rescued_by_validity={counts['rescued']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
