"""Assemble and run a training job from a Hydra config (the body of ``src/train.py``)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from score_lightning.config_validation import validate_config
from score_lightning.paths import corpus_path

log = logging.getLogger(__name__)


def resolve_output_dir(cfg: DictConfig) -> None:
    """Use Hydra's run dir when Hydra runs us, so DDP child processes share the parent's folder."""
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            with open_dict(cfg):
                cfg.paths.output_dir = HydraConfig.get().runtime.output_dir
    except ImportError:  # pragma: no cover
        pass


def tokenizer_extra_texts() -> list[str]:
    """Texts beyond the corpus that the tiny tokenizer should encode compactly: queries and prompts."""
    from score_lightning.data.queries import load_queries
    from score_lightning.harness.state import HarnessState
    from score_lightning.roles.prompts import rubric_messages, scoring_messages, solver_messages
    from score_lightning.roles.rubric import fallback_rubric

    state = HarnessState()
    rubric = fallback_rubric(state)
    queries = [q.prompt for q in load_queries(None)]
    texts = list(queries)
    for msgs in (solver_messages(queries[0], rubric, state, 3), rubric_messages(queries[:2], state),
                 scoring_messages(queries[0], ["r1", "r2"], rubric, state)):
        texts.extend(m["content"] for m in msgs)
    texts.append(rubric.to_xml())
    return texts


def resolve_model_path(cfg: DictConfig) -> str:
    """A local checkpoint dir: the configured one, or the tiny model built (and cached) from config."""
    if cfg.model.name_or_path:
        return str(cfg.model.name_or_path)
    from score_lightning.models import TinyModelSpec, ensure_tiny_checkpoint

    spec = TinyModelSpec(**OmegaConf.to_container(cfg.model.tiny, resolve=True))
    spec.validate()
    return str(ensure_tiny_checkpoint(Path(cfg.paths.cache_dir) / "models", spec, corpus_path(cfg), tokenizer_extra_texts()))


def build_strategy(cfg: DictConfig):
    s = cfg.strategy
    if s.name == "single":
        return "auto"
    if s.name == "ddp":
        from lightning.pytorch.strategies import DDPStrategy

        backend = s.get("process_group_backend") or ("gloo" if cfg.trainer.accelerator == "cpu" else None)
        return DDPStrategy(process_group_backend=backend, find_unused_parameters=not cfg.actor.shared)
    if s.name == "fsdp":
        from lightning.pytorch.strategies import ModelParallelStrategy

        tp = int(s.tensor_parallel_size)
        dp = s.data_parallel_size
        if dp in (None, "auto"):  # Lightning's "auto" would mean num_nodes; here: every process shards
            devices = cfg.trainer.devices
            world = (int(devices) if str(devices).isdigit() else 1) * int(cfg.trainer.num_nodes)
            dp = max(1, world // tp)
        return ModelParallelStrategy(
            data_parallel_size=int(dp),
            tensor_parallel_size=tp,
            save_distributed_checkpoint=bool(s.save_distributed_checkpoint),
        )
    raise ValueError(f"strategy.name={s.name!r}: allowed 'single', 'ddp', 'fsdp'")


def build_callbacks(cfg: DictConfig) -> list:
    from hydra.utils import instantiate

    from score_lightning.callbacks.checkpoint import ScoreCheckpoint
    from score_lightning.callbacks.collapse_guard import CollapseGuard
    from score_lightning.callbacks.meta_harness import MetaHarnessCallback

    from score_lightning.callbacks.preemption import PreemptionCallback

    cb = cfg.callbacks
    callbacks: list = [
        ScoreCheckpoint(dirpath=cb.model_checkpoint.dirpath, every_n_steps=int(cb.model_checkpoint.every_n_steps)),
        PreemptionCallback(grace_s=float(cb.preemption.grace_s)),
        MetaHarnessCallback(instantiate(cfg.harness.backend), every_n_steps=int(cb.meta_harness.every_n_steps),
                            enabled=bool(cfg.harness.enabled)),
    ]
    g = cb.collapse_guard
    if g.enabled:
        callbacks.append(CollapseGuard(window=int(g.window), entropy_drop_ratio=float(g.entropy_drop_ratio),
                                       entropy_floor=float(g.entropy_floor), reward_drop=float(g.reward_drop),
                                       patience=int(g.patience), min_steps=int(g.min_steps),
                                       best_path=os.path.join(cb.model_checkpoint.dirpath, "best.ckpt")))
    if cfg.rollout.engine == "vllm":
        from score_lightning.callbacks.vllm_rollout import VLLMRolloutCallback

        callbacks.append(VLLMRolloutCallback(cfg.rollout))
    return callbacks


def build_trainer(cfg: DictConfig, callbacks: list):
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import TensorBoardLogger

    from score_lightning.checkpoint_io import AtomicCheckpointIO

    t = cfg.trainer
    # FSDP writes sharded checkpoint directories through torch.distributed.checkpoint instead
    plugins = [] if cfg.strategy.name == "fsdp" else [AtomicCheckpointIO()]
    logger = TensorBoardLogger(save_dir=cfg.logger.save_dir, name=cfg.logger.name, version="", default_hp_metric=False)
    return pl.Trainer(
        accelerator=t.accelerator, devices=t.devices, num_nodes=t.num_nodes, strategy=build_strategy(cfg),
        precision=str(t.precision), max_steps=int(t.max_steps), max_epochs=-1,
        log_every_n_steps=int(t.log_every_n_steps), enable_progress_bar=bool(t.enable_progress_bar),
        callbacks=callbacks, logger=logger, num_sanity_val_steps=0, limit_val_batches=0,
        use_distributed_sampler=False, enable_model_summary=False, default_root_dir=cfg.paths.output_dir,
        enable_checkpointing=True, plugins=plugins,
    )


def run(cfg: DictConfig, extra_callbacks: list | None = None, module_hook=None) -> dict:
    """Validate, build, fit, export. Returns the final logged metrics.

    ``extra_callbacks`` and ``module_hook(module)`` let tests and drills reach into a real run.
    Raises :class:`~score_lightning.callbacks.preemption.Preempted` (exit code 75) after a
    preemption checkpoint, and :class:`~score_lightning.module.TrainingHalted` when the run stopped
    itself for safety (a checkpoint is saved in both cases).
    """
    import lightning.pytorch as pl

    from score_lightning.callbacks.preemption import Preempted, PreemptionCallback
    from score_lightning.data.datamodule import QueryDataModule
    from score_lightning.module import ScoreModule

    resolve_output_dir(cfg)
    validate_config(cfg)
    pl.seed_everything(int(cfg.seed), workers=True)
    torch.set_float32_matmul_precision("high")
    model_path = resolve_model_path(cfg)
    model_path = maybe_run_sft(cfg, model_path)
    dm = QueryDataModule(cfg.data.queries_path, int(cfg.data.batch_size), int(cfg.seed), int(cfg.data.num_workers))
    module = ScoreModule(cfg, model_path)
    if module_hook is not None:
        module_hook(module)
    callbacks = build_callbacks(cfg) + list(extra_callbacks or [])
    trainer = build_trainer(cfg, callbacks)
    trainer.fit(module, datamodule=dm, ckpt_path=cfg.ckpt_path)
    if any(isinstance(c, PreemptionCallback) and c.preempted for c in callbacks):
        raise Preempted()
    export = Path(cfg.paths.output_dir) / "export"
    module.export_policy(export)
    if trainer.is_global_zero:
        log.info("exported policy to %s", export)
    return {k: float(v) for k, v in trainer.callback_metrics.items()}


def maybe_run_sft(cfg: DictConfig, model_path: str) -> str:
    """Cold-start SFT (experiment=tiny_score) when configured; returns the checkpoint RL starts from."""
    sft = cfg.get("sft")
    if not sft or not sft.get("enabled", False):
        return model_path
    from score_lightning.sft import run_sft

    return str(run_sft(cfg, model_path))
