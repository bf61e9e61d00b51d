"""``run_sft(cfg, model_path) -> Path``: the supervised cold start before SCORE, cached by its inputs.

Steps: build the demonstrations (:mod:`score_lightning.sft.demos`) for the run's tokenizer,
retriever, queries, harness state and RL budgets; fine-tune the base checkpoint on them with
:class:`~score_lightning.sft.module.SFTModule`; optionally sample a few rubrics / trajectories /
evaluations from the result with the real agent loop (the *probe*); save ``save_pretrained`` model
+ tokenizer + ``sft_meta.json`` under ``sft.cache_dir/sft-<key>``.

``<key>`` hashes every input that changes the result: the base checkpoint's files, the ``sft``
config (minus knobs that do not change weights), the demo-generation and training versions, the
corpus / retriever, the query file, the harness's initial state and the RL budgets. When that
directory exists it is reused without training. The directory is written to a temporary sibling
and renamed into place, under a file lock, so concurrent ranks or interrupted runs never see a
half-written checkpoint.

SFT runs with its own fixed seed (``sft.seed``) and restores the global RNG state afterwards, so the
RL run that follows is the same whether the checkpoint was trained now or taken from the cache.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import math
import os
import random
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from score_lightning.sft.demos import DEMO_VERSION, Demo, DemoBudgets, build_demos, demo_summary

log = logging.getLogger(__name__)

#: Bump when the training procedure changes (loss, schedule, saving), so caches are invalidated.
SFT_FORMAT_VERSION = 1
META_FILE = "sft_meta.json"
#: ``sft`` keys that do not change the trained weights (excluded from the cache key)
_NON_KEY_FIELDS = ("enabled", "cache_dir", "log_every_n_steps", "probe", "log_samples", "shared_prompt")
#: files above this size are hashed by (size, first and last MiB) instead of their full content
_FULL_HASH_LIMIT = 256 << 20


# ---------------------------------------------------------------------------- hashing
def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    size = path.stat().st_size
    h.update(str(size).encode())
    with open(path, "rb") as fh:
        if size <= _FULL_HASH_LIMIT:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        else:
            h.update(fh.read(1 << 20))
            fh.seek(size - (1 << 20))
            h.update(fh.read(1 << 20))
    return h.hexdigest()


def checkpoint_digest(model_path: str | os.PathLike) -> str:
    """Hash of a local checkpoint directory's files (names + contents); a hub id hashes as its name."""
    p = Path(model_path)
    if not p.is_dir():
        return "hub:" + str(model_path)
    h = hashlib.sha256()
    for f in sorted(x for x in p.rglob("*") if x.is_file()):
        h.update(str(f.relative_to(p)).encode())
        h.update(_file_digest(f).encode())
    return h.hexdigest()


def _retriever_identity(cfg: DictConfig) -> dict[str, Any]:
    r = cfg.retriever
    if r.kind == "bm25":
        from score_lightning.training import corpus_path

        return {"kind": "bm25", "corpus": _file_digest(corpus_path(cfg))}
    return {"kind": str(r.kind), "url": str(r.get("url"))}


def _queries_identity(cfg: DictConfig) -> str:
    from score_lightning.data.queries import EMBEDDED_QUERIES_PATH

    path = cfg.data.get("queries_path") or EMBEDDED_QUERIES_PATH
    return _file_digest(Path(path))


def sft_key_inputs(cfg: DictConfig, model_path: str) -> dict[str, Any]:
    """Everything the SFT result depends on, as a JSON-able dict (hashed into the cache key)."""
    s = OmegaConf.to_container(cfg.sft, resolve=True)
    for k in _NON_KEY_FIELDS:
        s.pop(k, None)
    return {
        "base": checkpoint_digest(model_path),
        "sft": s,
        "demo_version": DEMO_VERSION,
        "format_version": SFT_FORMAT_VERSION,
        "retriever": _retriever_identity(cfg),
        "queries": _queries_identity(cfg),
        "harness_initial_state": OmegaConf.to_container(cfg.harness.initial_state, resolve=True),
        "budgets": asdict(DemoBudgets.from_cfg(cfg)),
        "dtype": str(cfg.model.dtype),
    }


def sft_cache_dir(cfg: DictConfig) -> Path:
    d = cfg.sft.get("cache_dir")
    return Path(d) if d else Path(cfg.paths.cache_dir) / "sft"


def sft_output_path(cfg: DictConfig, model_path: str) -> tuple[Path, dict[str, Any]]:
    inputs = sft_key_inputs(cfg, model_path)
    key = hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return sft_cache_dir(cfg) / f"sft-{key}", inputs


def is_complete(path: Path) -> bool:
    return (path / META_FILE).is_file() and (path / "config.json").is_file()


# ---------------------------------------------------------------------------- helpers
@contextmanager
def preserved_rng():
    """Run a block without disturbing the global torch / numpy / python RNG (nor PL_GLOBAL_SEED)."""
    torch_state = torch.get_rng_state()
    cuda_state = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    np_state = np.random.get_state()
    py_state = random.getstate()
    env = os.environ.get("PL_GLOBAL_SEED")
    try:
        yield
    finally:
        torch.set_rng_state(torch_state)
        if cuda_state is not None:
            torch.cuda.set_rng_state_all(cuda_state)
        np.random.set_state(np_state)
        random.setstate(py_state)
        if env is None:
            os.environ.pop("PL_GLOBAL_SEED", None)
        else:
            os.environ["PL_GLOBAL_SEED"] = env


@contextmanager
def _file_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _sft_logger(cfg: DictConfig):
    from lightning.pytorch.loggers import TensorBoardLogger

    save_dir = OmegaConf.select(cfg, "logger.save_dir", default=None) or cfg.paths.output_dir
    name = OmegaConf.select(cfg, "logger.name", default="tensorboard") or "tensorboard"
    return TensorBoardLogger(save_dir=str(save_dir), name=str(name), version="sft", default_hp_metric=False)


def build_sft_demos(cfg: DictConfig, tokenizer, retriever=None) -> tuple[list[Demo], dict]:
    """The demonstrations ``run_sft`` trains on, for this config (also used by tests and probes)."""
    from score_lightning.data.queries import load_queries
    from score_lightning.harness.state import HarnessState
    from score_lightning.retrieval.from_config import retriever_from_config

    s = cfg.sft
    if retriever is None:
        retriever = retriever_from_config(cfg.retriever, cfg.paths.cache_dir)
    queries = [q.prompt for q in load_queries(cfg.data.get("queries_path"))]
    base = HarnessState.from_dict(OmegaConf.to_container(cfg.harness.initial_state, resolve=True))
    per = OmegaConf.to_container(s.responses_per_prompt, resolve=True) if s.get("responses_per_prompt") else None
    demos, stats = build_demos(
        tokenizer, retriever, queries, DemoBudgets.from_cfg(cfg), int(s.num_solver_demos), int(s.num_rubric_demos),
        int(s.num_scoring_demos), seed=int(s.seed), base_state=base, per_prompt=per,
    )
    max_len = int(s.max_seq_len)
    kept = [d for d in demos if d.num_tokens <= max_len]
    if len(kept) < len(demos):
        log.warning("sft: dropped %d demos longer than sft.max_seq_len=%d", len(demos) - len(kept), max_len)
    info = {"built": stats.built, "dropped_budget": stats.dropped, "dropped_max_seq_len": len(demos) - len(kept),
            **demo_summary(kept)}
    return kept, info


def train_sft(model, demos: list[Demo], pad_id: int, scfg: DictConfig, trainer_kwargs: dict, logger) -> dict[str, float]:
    """Fit ``model`` on ``demos`` in place; returns the final metrics."""
    import lightning.pytorch as pl

    from score_lightning.sft.module import SFTModule, make_loader

    bs = int(scfg.batch_size)
    loader = make_loader(demos, bs, seed=int(scfg.seed))
    steps_per_epoch = len(loader)
    epochs = int(scfg.epochs)
    max_steps = int(scfg.max_steps) if int(scfg.get("max_steps", -1)) > 0 else epochs * steps_per_epoch
    max_steps = min(max_steps, epochs * steps_per_epoch)
    module = SFTModule(model, pad_id, lr=float(scfg.lr), weight_decay=float(scfg.weight_decay), betas=tuple(scfg.betas),
                       warmup_steps=int(scfg.warmup_steps), max_steps=max_steps,
                       min_lr_ratio=float(scfg.min_lr_ratio), grad_clip=float(scfg.grad_clip),
                       shared_prompt=bool(scfg.get("shared_prompt", True)),
                       prompt_loss_weight=float(scfg.get("prompt_loss_weight", 0.0)))
    trainer = pl.Trainer(
        max_steps=max_steps, max_epochs=epochs, logger=logger, enable_checkpointing=False,
        log_every_n_steps=int(scfg.log_every_n_steps), enable_model_summary=False, num_sanity_val_steps=0,
        limit_val_batches=0, use_distributed_sampler=False, precision=str(scfg.precision), **trainer_kwargs,
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


# ---------------------------------------------------------------------------- probe
def probe_policy(model, tokenizer, retriever, cfg: DictConfig, n_rubric: int, n_solver: int, seed: int = 0,
                 n_scoring: int | None = None) -> dict[str, float]:
    """Sample from ``model`` exactly as a first RL step would and report validity rates.

    Rubrics: the harness's initial state with the scheduler's first-step hints, at the evaluator
    temperature. Solver: real multi-turn rollouts (``run_agent`` + ``HFEngine`` + the retriever)
    at the solver temperature. Scoring: the solver answers, K per prompt, parsed as RL parses them.
    """
    from score_lightning import protocol as P
    from score_lightning.data.queries import load_queries
    from score_lightning.harness.scheduler import DimensionScheduler
    from score_lightning.harness.state import HarnessState
    from score_lightning.roles.answer import parse_answer
    from score_lightning.roles.evaluation import parse_evaluation
    from score_lightning.roles.prompts import rubric_messages, scoring_messages, solver_messages
    from score_lightning.roles.rubric import fallback_rubric, parse_rubric
    from score_lightning.rollout.agent import TagStops, run_agent
    from score_lightning.rollout.engine import SamplingParams
    from score_lightning.rollout.hf_engine import HFEngine
    from score_lightning.sft.demos import chat_ids, truncate_text

    b = DemoBudgets.from_cfg(cfg)
    rng = random.Random(seed)
    queries = [q.prompt for q in load_queries(cfg.data.get("queries_path"))]
    state = HarnessState.from_dict(OmegaConf.to_container(cfg.harness.initial_state, resolve=True))
    sched = DimensionScheduler(list(state.dimension_pool))
    engine = HFEngine(lambda: model, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer,
                      int(OmegaConf.select(cfg, "rollout.max_batch_size", default=64)))
    out: dict[str, float] = {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if n_rubric > 0:
            nq = int(cfg.data.batch_size)
            prompts = [chat_ids(tokenizer, rubric_messages(rng.sample(queries, nq), state, sched.required(),
                                                            sched.avoided(), sched.explore()))
                       for _ in range(n_rubric)]
            stops = TagStops(tokenizer, [P.DIMENSIONS_CLOSE])
            gens = engine.generate(prompts, SamplingParams(b.max_rubric_tokens, float(cfg.evaluator.temperature),
                                                           stop_token_ids=stops.token_ids, stop_strings=stops.strings))
            parses = [parse_rubric(tokenizer.decode(g.token_ids), state) for g in gens]
            out["probe/rubric_valid_rate"] = float(np.mean([p.valid for p in parses]))
            out["probe/rubric_parsed_rate"] = float(np.mean([p.rubric is not None for p in parses]))
            out["probe/rubric_len_mean"] = float(np.mean([len(g.token_ids) for g in gens]))
            errors: dict[str, int] = {}
            for p in parses:
                if not p.valid:
                    errors[p.error.split("'")[0].strip()] = errors.get(p.error.split("'")[0].strip(), 0) + 1
            out["probe/rubric_errors"] = errors  # type: ignore[assignment]
        if n_solver > 0:
            K = b.num_rollouts
            rubric = fallback_rubric(state)
            prompts, group_queries = [], []
            n_groups = max(1, math.ceil(n_solver / K))
            for _ in range(n_groups):
                q = rng.choice(queries)
                group_queries.append(q)
                ids = chat_ids(tokenizer, solver_messages(q, rubric, state, b.solver_max_tool_calls))
                prompts.extend([ids] * K)
            solver_cfg = b.solver_agent()
            solver_cfg = type(solver_cfg)(**{**solver_cfg.__dict__, "temperature": float(cfg.solver.temperature),
                                             "top_p": float(cfg.solver.top_p)})
            trajs = run_agent(engine, tokenizer, prompts, retriever, solver_cfg)
            answers = [parse_answer(t.model_text(tokenizer), t.truncated,
                                    require_citation=bool(cfg.reward.require_citation),
                                    min_chars=int(cfg.reward.min_answer_chars)) for t in trajs]
            out["probe/answer_valid_rate"] = float(np.mean([a.valid for a in answers]))
            out["probe/cited_rate"] = float(np.mean([bool(a.cited_ids) for a in answers]))
            cite_ok = [float(all(c in t.retrieved_ids for c in a.cited_ids)) for a, t in zip(answers, trajs) if a.cited_ids]
            out["probe/citation_validity"] = float(np.mean(cite_ok)) if cite_ok else 0.0
            out["probe/tool_calls_mean"] = float(np.mean([t.tool_calls for t in trajs]))
            out["probe/invalid_actions_mean"] = float(np.mean([t.invalid_actions for t in trajs]))
            out["probe/truncated_rate"] = float(np.mean([t.truncated for t in trajs]))
            out["probe/response_len_mean"] = float(np.mean([len(t.response_ids) for t in trajs]))
            n_sc = n_groups if n_scoring is None else min(n_scoring, n_groups)
            if n_sc > 0:
                eval_cfg = b.scoring_agent()
                eval_cfg = type(eval_cfg)(**{**eval_cfg.__dict__, "temperature": float(cfg.evaluator.temperature)})
                sprompts = []
                for g in range(n_sc):
                    reps = [truncate_text(tokenizer, a.answer if a.answer else "(no report)", b.max_report_tokens)
                            for a in answers[g * K:(g + 1) * K]]
                    sprompts.append(chat_ids(tokenizer, scoring_messages(group_queries[g], reps, rubric, state)))
                strajs = run_agent(engine, tokenizer, sprompts, retriever, eval_cfg)
                pc = state.process_constraints
                evs = [parse_evaluation(t.model_text(tokenizer), rubric, K, require_verification=pc.require_verification,
                                        require_gap_analysis=pc.require_gap_analysis) for t in strajs]
                out["probe/scoring_valid_rate"] = float(np.mean([e.valid for e in evs]))
                out["probe/scoring_reports_parsed"] = float(np.mean([len(e.reports) / K for e in evs]))
                out["probe/scoring_tool_calls_mean"] = float(np.mean([len(t.search_queries) for t in strajs]))
                out["probe/scoring_truncated_rate"] = float(np.mean([t.truncated for t in strajs]))
    return out


# ---------------------------------------------------------------------------- entry point
def _log_to_tb(logger, metrics: dict, texts: dict[str, str], step: int = 0) -> None:
    """Run summary (final loss, timings, probe rates, cache hit) as ``sft/summary/*`` scalars at ``step``."""
    exp = getattr(logger, "experiment", None)
    if exp is None:
        return
    for k, v in metrics.items():
        if isinstance(v, (int, float)) and math.isfinite(float(v)):
            name = k[len("sft/"):] if k.startswith("sft/") else k
            exp.add_scalar(f"sft/summary/{name}", float(v), step)
    for k, t in texts.items():
        exp.add_text(k, t, step)
    exp.flush()


def _sample_texts(demos: list[Demo], tokenizer) -> dict[str, str]:
    texts = {}
    for kind in ("solver", "rubric", "scoring"):
        d = next((x for x in demos if x.kind == kind), None)
        if d is not None:
            texts[f"sft/sample_{kind}"] = "```\n" + tokenizer.decode(d.response_ids) + "\n```"
    return texts


def run_sft(cfg: DictConfig, model_path: str) -> Path:
    """Return a checkpoint fine-tuned on the demonstrations: from the cache when its inputs are unchanged."""
    out, inputs = sft_output_path(cfg, model_path)
    logger = _sft_logger(cfg)
    with _file_lock(out.parent / f".{out.name}.lock"):
        if is_complete(out):
            meta = json.loads((out / META_FILE).read_text())
            log.info("sft: reusing cached cold-start checkpoint %s (no training)", out)
            m = meta.get("metrics", {})
            _log_to_tb(logger, {**m, "sft/cache_hit": 1.0}, {"sft/info": f"reused cached SFT checkpoint `{out}`"},
                       step=int(m.get("sft/steps", 0)))
            return out
        with preserved_rng():
            meta = _build(cfg, model_path, out, inputs, logger)
        _log_to_tb(logger, {**meta["metrics"], "sft/cache_hit": 0.0}, {"sft/info": f"trained SFT checkpoint `{out}`"},
                   step=int(meta["metrics"].get("sft/steps", 0)))
    return out


def _build(cfg: DictConfig, model_path: str, out: Path, inputs: dict, logger) -> dict:
    import lightning.pytorch as pl
    from transformers import AutoTokenizer

    from score_lightning.models import load_policy, load_tokenizer
    from score_lightning.retrieval.from_config import retriever_from_config

    s = cfg.sft
    t0 = time.perf_counter()
    pl.seed_everything(int(s.seed), workers=True, verbose=False)
    tokenizer = load_tokenizer(model_path)
    retriever = retriever_from_config(cfg.retriever, cfg.paths.cache_dir)
    demos, info = build_sft_demos(cfg, tokenizer, retriever)
    if not demos:
        raise RuntimeError("sft: no demonstrations fit the budgets; raise solver/evaluator budgets or disable sft")
    t_demos = time.perf_counter() - t0
    log.info("sft: %d demonstrations in %.1fs (%s)", len(demos), t_demos,
             ", ".join(f"{k}={v}" for k, v in info["built"].items()))
    model = load_policy(model_path, str(cfg.model.dtype), bool(cfg.model.get("gradient_checkpointing", False)))
    accel = str(OmegaConf.select(cfg, "trainer.accelerator", default="cpu"))
    trainer_kwargs = {"accelerator": accel, "devices": 1,
                      "enable_progress_bar": bool(OmegaConf.select(cfg, "trainer.enable_progress_bar", default=True))}
    metrics = train_sft(model, demos, tokenizer.pad_token_id, s, trainer_kwargs, logger)
    metrics["sft/demos_s"] = t_demos
    metrics["sft/num_demos"] = float(len(demos))
    probe = s.get("probe") or {}
    if int(probe.get("num_rubrics", 0)) > 0 or int(probe.get("num_solver", 0)) > 0:
        tp = time.perf_counter()
        pm = probe_policy(model, tokenizer, retriever, cfg, int(probe.get("num_rubrics", 0)),
                          int(probe.get("num_solver", 0)), seed=int(s.seed), n_scoring=int(probe.get("num_scoring", 1)))
        pm.pop("probe/rubric_errors", None)
        metrics.update({f"sft/{k}": v for k, v in pm.items()})
        metrics["sft/probe_s"] = time.perf_counter() - tp
        log.info("sft probe: %s", ", ".join(f"{k}={v:.2f}" for k, v in pm.items()))
    metrics["sft/total_s"] = time.perf_counter() - t0
    if bool(s.get("log_samples", True)):
        _log_to_tb(logger, {}, _sample_texts(demos, tokenizer))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".tmp-sft-"))
    meta = {"inputs": inputs, "metrics": metrics, "demos": info, "base_model": str(model_path)}
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        AutoTokenizer.from_pretrained(str(model_path)).save_pretrained(tmp)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True, default=str))
        try:
            os.rename(tmp, out)
        except OSError:  # another process finished first: its result is identical
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("sft: saved cold-start checkpoint to %s (%.0fs: loss %.3f, token_acc %.3f)", out,
             metrics["sft/total_s"], metrics.get("sft/loss", float("nan")), metrics.get("sft/token_acc", float("nan")))
    return meta
