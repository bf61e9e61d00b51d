"""The demonstrations for a run config, and fitting a model on them with Lightning.

The two steps of a cold start that do the work, without the caching around them
(:mod:`score_lightning.sft.run`), so tests and benchmarks can call them directly.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from omegaconf import DictConfig, OmegaConf

from score_lightning.sft.demo_types import Demo, demo_budgets, report_shape
from score_lightning.sft.demos import build_demos, demo_summary
from score_lightning.sft.demo_types import SCORING_TARGETS
from score_lightning.sft.workflow_demos import workflow_demo_spec, workflow_kinds

if TYPE_CHECKING:
    from score_lightning.config.schema import RewardConfig
    from score_lightning.sft.config import SftConfig

log = logging.getLogger(__name__)



def build_sft_demos(cfg: DictConfig, tokenizer, retriever=None) -> tuple[list[Demo], dict]:
    """The demonstrations ``run_sft`` trains on, for this config (also used by tests and probes)."""
    from score_lightning.data.queries import load_queries
    from score_lightning.harness.state import HarnessState
    from score_lightning.retrieval.from_config import retriever_from_config

    s = cfg.sft
    if retriever is None:
        retriever = retriever_from_config(cfg.retriever, cfg.paths.cache_dir)
    queries = [q.prompt for q in load_queries(cfg.data.queries_path, cfg.data.split)]
    base = HarnessState.from_dict(OmegaConf.to_container(cfg.harness.initial_state, resolve=True))
    per = OmegaConf.to_container(s.responses_per_prompt, resolve=True) if s.responses_per_prompt else None
    demos, stats = build_demos(
        tokenizer, retriever, queries, demo_budgets(cfg.solver, cfg.evaluator), int(s.num_solver_demos),
        int(s.num_rubric_demos), int(s.num_scoring_demos), seed=int(s.seed), base_state=base, per_prompt=per,
        extra=workflow_kinds(workflow_demo_spec(cfg)),  # solver.agent=mams / reward.step=rubric only
        scoring_contrast=float(s.scoring_contrast),
        scoring_weights=scoring_kind_weights(s),  # None: the default mix of report kinds
        report=report_shape(s.report),  # None: the short answers of the packaged tiny cold start
        items=scoring_items(s, cfg.reward),  # None unless sft.scoring_targets=items
    )
    max_len = int(s.max_seq_len)
    kept = [d for d in demos if d.num_tokens <= max_len]
    if len(kept) < len(demos):
        log.warning("sft: dropped %d demos longer than sft.max_seq_len=%d", len(demos) - len(kept), max_len)
    info = {"built": stats.built, "dropped_budget": stats.dropped, "dropped_max_seq_len": len(demos) - len(kept),
            **demo_summary(kept)}
    return kept, info


def scoring_kind_weights(sft: "SftConfig") -> tuple[float, ...] | None:
    """``sft.scoring_kind_weights``: None (the default mix) or each report kind's draw weight, the named kinds
    replaced (read and refused by :func:`~score_lightning.sft.demo_types.kind_weights`)."""
    from score_lightning.sft.demo_types import kind_weights

    raw = sft.scoring_kind_weights
    return None if raw is None else kind_weights(OmegaConf.to_container(raw, resolve=True))


def scoring_items(sft: "SftConfig", reward: "RewardConfig") -> dict[str, list] | None:
    """``sft.scoring_targets``: ``kind`` (None: scores follow the report's kind) or ``items`` (each question's evidence
    items from ``reward.items_path``, by question text, so valid reports' scores follow their ``item_recall``)."""
    mode = str(sft.scoring_targets)
    if mode not in SCORING_TARGETS:
        raise ValueError(f"sft.scoring_targets={mode!r}: allowed {', '.join(SCORING_TARGETS)}")
    if mode == "kind":
        return None
    from score_lightning.data.items import load_items

    return {q.prompt.strip(): list(q.items) for q in load_items(reward.items_path).values()}


def train_sft(model, demos: list[Demo], pad_id: int, scfg: "SftConfig", trainer_kwargs: dict,
              logger) -> dict[str, float]:
    """Fit ``model`` on ``demos`` in place; returns the final metrics."""
    import lightning.pytorch as pl

    from score_lightning.sft.module import SFTModule, make_loader

    bs = int(scfg.batch_size)
    loader = make_loader(demos, bs, seed=int(scfg.seed))
    steps_per_epoch = len(loader)
    epochs = int(scfg.epochs)
    max_steps = int(scfg.max_steps) if int(scfg.max_steps) > 0 else epochs * steps_per_epoch
    max_steps = min(max_steps, epochs * steps_per_epoch)
    module = SFTModule(model, pad_id, lr=float(scfg.lr), weight_decay=float(scfg.weight_decay), betas=tuple(scfg.betas),
                       warmup_steps=int(scfg.warmup_steps), max_steps=max_steps,
                       min_lr_ratio=float(scfg.min_lr_ratio), grad_clip=float(scfg.grad_clip),
                       shared_prompt=bool(scfg.shared_prompt), prompt_loss_weight=float(scfg.prompt_loss_weight))
    kwargs = dict(trainer_kwargs)
    if kwargs.pop("enable_progress_bar", True):  # cold-start steps with an ETA (a log line without a terminal)
        from score_lightning.telemetry.progress import ScoreProgress

        kwargs["callbacks"] = [ScoreProgress(desc="cold start (SFT) steps")]
    kwargs["enable_progress_bar"] = "callbacks" in kwargs
    trainer = pl.Trainer(
        max_steps=max_steps, max_epochs=epochs, logger=logger, enable_checkpointing=False,
        log_every_n_steps=int(scfg.log_every_n_steps), enable_model_summary=False, num_sanity_val_steps=0,
        limit_val_batches=0, use_distributed_sampler=False, precision=str(scfg.precision), **kwargs,
    )
    t0 = time.perf_counter()
    model.train()
    trainer.fit(module, train_dataloaders=loader)
    model.eval()
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("sft/")}
    metrics["sft/train_s"] = time.perf_counter() - t0
    metrics["sft/steps"] = float(trainer.global_step)
    metrics["sft/trained_tokens"] = float(module.tokens_seen)
    return metrics
