"""The evaluator while it co-evolves: every N steps it scores a fixed pair set, and the run logs what it knows.

``scripts/bench_evaluator.py`` measures an evaluator once, on held-out pairs. A study also wants the curve: does
the co-evolving evaluator learn to rank valid reports, or only to tell a report from a broken one? This callback
scores a stored pair set (``bench_evaluator.py --split train`` writes one on training queries; its digest is
checked on load) with the run's own evaluator as the step uses it: its engine and weights now, the rubric its
source would write under the current harness constraints, the step's scoring protocol, readout and budgets
(:mod:`score_lightning.evaluation.pair_scoring`). It logs, at step s = the number of SCORE steps done (0: before
the first update):

* ``evaluator/pair_acc`` and ``evaluator/valid_pair_acc``: pairwise accuracy over the degraded and the valid pairs
  (a tie counts 1/2), with ``..._lo`` / ``..._hi``, their 95% query-bootstrap interval;
* ``evaluator/pairs_auc``: the ROC AUC over every scored pair; ``evaluator/pairs_scored``: pairs both of whose
  sides a complete evaluation reached (the others are left out, never scored 0);
* ``time/evaluator_pairs_s``: what the probe cost.

Nothing it does moves the run: the rubric source and the dimension scheduler are copies, the torch, numpy and
Python random streams are restored afterwards, and so are the HF engines' stored KV caches (the next step's prefill
never reuses the probe's prompts), so on HF engines a run with the probe samples exactly what it samples without.
Under ``rollout=vllm`` the probe's prompts stay in vLLM's prefix cache, which cannot be put back; that is checked
on HF engines only.
Off by default (``every_n_steps: 0``): on CPU the SmolLM2 probe of a few dozen pairs costs minutes, more than a
tenth of a step. One process only, where the trainer holds its engine (``rollout.mode=sync``).

A Lightning callback that lives in ``evaluation/``: all it does is evaluation's pair scoring on the live module,
so ``callbacks/`` (the run's own controls) imports nothing from evaluation, and ``launch/`` composes it through
``configs/callbacks/evaluator_pairs.yaml`` like any callback.
"""

from __future__ import annotations

import copy
import logging
import time
from pathlib import Path

import lightning as L

log = logging.getLogger(__name__)


class EvaluatorPairs(L.Callback):
    def __init__(self, pair_set: str | None = None, every_n_steps: int = 0, resamples: int = 200) -> None:
        if int(every_n_steps) < 0:
            raise ValueError(f"callbacks.evaluator_pairs.every_n_steps={every_n_steps}: an integer >= 0 (0: off)")
        if int(every_n_steps) > 0 and not pair_set:
            raise ValueError("callbacks.evaluator_pairs.every_n_steps > 0 needs callbacks.evaluator_pairs.pair_set: "
                             "a stored pair set (python scripts/bench_evaluator.py --split train ...)")
        self.every, self.path, self.resamples = int(every_n_steps), pair_set, int(resamples)
        self.pairs = None

    @property
    def enabled(self) -> bool:
        return self.every > 0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not self.enabled:
            return
        from score_lightning.evaluation.pair_set import read_pair_set
        from score_lightning.rollout.modes import asynchronous

        if trainer.world_size > 1:
            raise ValueError("callbacks.evaluator_pairs: one process only (the probe generates on one rank); score a "
                             "checkpoint with scripts/bench_evaluator.py --model instead")
        if asynchronous(pl_module.cfg.rollout):
            raise ValueError("callbacks.evaluator_pairs with rollout.mode=async: the rollout worker holds the engine; "
                             "use rollout.mode=sync or score checkpoints with scripts/bench_evaluator.py --model")
        self.pairs, manifest = read_pair_set(self.path)
        log.info("evaluator pairs: %s (%s, %d pairs) every %d steps", Path(self.path).name, manifest.get("digest"),
                 len(self.pairs), self.every)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.enabled and pl_module.score_step == 0:
            self._probe(trainer, pl_module)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args) -> None:
        if self.enabled and pl_module.score_step % self.every == 0:
            self._probe(trainer, pl_module)

    def _probe(self, trainer: L.Trainer, module) -> None:
        metrics = self.measure(module)
        if trainer.logger is not None:
            trainer.logger.log_metrics(metrics, step=module.score_step)
        log.info("evaluator pairs at step %d: pair_acc=%.3f valid_pair_acc=%.3f (%d scored, %.1fs)", module.score_step,
                 metrics.get("evaluator/pair_acc", float("nan")), metrics.get("evaluator/valid_pair_acc", float("nan")),
                 int(metrics["evaluator/pairs_scored"]), metrics["time/evaluator_pairs_s"])

    def measure(self, module) -> dict[str, float]:
        """Score the pair set with the module's evaluator now; the scalars above (NaN-free: a missing kind is left out)."""
        import math

        import torch

        from score_lightning.evaluation import pair_scoring as S
        from score_lightning.evaluation.pair_metrics import summarise_kinds
        from score_lightning.rewards.report_pairs import EDIT_KINDS
        from score_lightning.rng import preserved_rng
        from score_lightning.rollout.kv_cache import stores_kept

        t0 = time.perf_counter()
        qids = sorted({(p.query_id, p.query) for p in self.pairs})
        ctx = module.rubric_context()
        ctx.scheduler = copy.deepcopy(ctx.scheduler)
        cfg = module.cfg
        was_training = [m.training for m in (module.policy, module.eval_model)]
        with preserved_rng(), stores_kept(module.engine, module.evaluator_engine), torch.no_grad():
            source = copy.deepcopy(module.rubric_source)
            rubrics, _ = S.query_rubrics(source, ctx, qids, int(cfg.data.batch_size), int(cfg.solver.topk))
            outcome = S.evaluator_scores(module.evaluator_engine, module.tokenizer, module.retriever, self.pairs,
                                         rubrics, module.harness_state, module.rollout_settings,
                                         int(cfg.rollout.max_batch_size))
        for m, training in zip((module.policy, module.eval_model), was_training):
            m.train(training)
        rows = [(p.query_id, p.kind, s[p.better], s[p.worse]) for p, s in zip(self.pairs, outcome.scores)
                if None not in s]
        summary = summarise_kinds(rows, EDIT_KINDS, self.resamples)
        out = {"evaluator/pairs_scored": float(len(rows)), "time/evaluator_pairs_s": time.perf_counter() - t0}
        for kind, tag in (("degraded", "pair_acc"), ("valid", "valid_pair_acc")):
            s = summary.get(kind)
            if s is not None and s.pairs:
                out.update({f"evaluator/{tag}": s.pair_acc.value, f"evaluator/{tag}_lo": s.pair_acc.lo,
                            f"evaluator/{tag}_hi": s.pair_acc.hi})
        if summary.get("all") is not None and summary["all"].pairs:
            out["evaluator/pairs_auc"] = summary["all"].auc.value
        return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(float(v))}
