"""``run_sft(cfg, model_path) -> Path``: the supervised cold start before SCORE, cached by its inputs.

Steps: build the demonstrations for the run's tokenizer, retriever, queries, harness state and RL
budgets, and fine-tune the base checkpoint on them (:mod:`score_lightning.sft.train`); optionally
sample a few rubrics / trajectories / evaluations from the result with the real agent loop
(:mod:`score_lightning.sft.probe`); save ``save_pretrained`` model + tokenizer + ``sft_meta.json``
under ``sft.cache_dir/sft-<key>``, plus ``run_config.json``: the run settings evaluation needs (solver
budgets and sampling, the prompt's harness state, the reward rule;
:func:`~score_lightning.data.run_config.write_run_settings`), so ``scripts/evaluate.py`` rolls the
cold start out as the run would. It is written when the checkpoint is trained, installed from the
package (whose files stay as packaged) or reused from a cache that lacks it.

``<key>`` hashes every input that changes the result (:mod:`score_lightning.sft.cache`). When that
directory exists it is reused without training. The directory is written to a temporary sibling
and renamed into place, under a file lock, so concurrent ranks or interrupted runs never see a
half-written checkpoint.

SFT runs with its own fixed seed (``sft.seed``) and restores the global RNG state afterwards, so the
RL run that follows is the same whether the checkpoint was trained now or taken from the cache. So do
a LoRA cold start's install (``sft/adapter_asset.py``) and the GGUF conversion of the base
(``launch/gguf_checkpoint.py``): :func:`~score_lightning.rng.preserved_rng` around each.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from score_lightning.data.run_config import write_run_settings
from score_lightning.rng import preserved_rng
from score_lightning.sft.cache import META_FILE, is_complete, sft_output_path
from score_lightning.sft.demo_types import Demo
from score_lightning.sft.probe import probe_policy
from score_lightning.sft.train import build_sft_demos, train_sft

log = logging.getLogger(__name__)


@contextmanager
def _file_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _sft_loggers(cfg: DictConfig) -> list:
    """The run's configured loggers, in an ``sft`` sub-run (``tensorboard/sft``, ``csv/sft``, ...)."""
    from score_lightning.telemetry.loggers import build_loggers

    return build_loggers(cfg.logger, version="sft")


def _log_summary(loggers: list, metrics: dict, texts: dict[str, str], output_dir: str, step: int = 0) -> None:
    """Run summary (final loss, timings, probe rates, cache hit) as ``sft/summary/*`` scalars at ``step``."""
    from score_lightning.telemetry.loggers import log_texts

    summary = {f"sft/summary/{k[len('sft/'):] if k.startswith('sft/') else k}": float(v) for k, v in metrics.items()
               if isinstance(v, (int, float)) and math.isfinite(float(v))}
    for lg in loggers:
        lg.log_metrics(summary, step=step)
        lg.save()
    log_texts(loggers, texts, step, output_dir)


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
    loggers = _sft_loggers(cfg)
    where = str(cfg.paths.output_dir)
    with _file_lock(out.parent / f".{out.name}.lock"):
        if not is_complete(out) and bool(cfg.sft.use_packaged):
            from score_lightning.sft.asset import install_packaged

            install_packaged(out, base_path=model_path, inputs=inputs)  # tiny_score's ships with the package
        if is_complete(out):
            _record_settings(out, cfg, out.name)
            meta = json.loads((out / META_FILE).read_text())
            log.info("sft: reusing cached cold-start checkpoint %s (no training)", out)
            m = meta.get("metrics", {})
            _log_summary(loggers, {**m, "sft/cache_hit": 1.0}, {"sft/info": f"reused cached SFT checkpoint `{out}`"},
                         where, step=int(m.get("sft/steps", 0)))
            return out
        with preserved_rng():
            meta = _build(cfg, model_path, out, inputs, loggers)
        _log_summary(loggers, {**meta["metrics"], "sft/cache_hit": 0.0}, {"sft/info": f"trained SFT checkpoint `{out}`"},
                     where, step=int(meta["metrics"].get("sft/steps", 0)))
    return out


def _record_settings(directory: Path, cfg: DictConfig, key: str) -> None:
    """``run_config.json`` beside the cold start's weights (first run wins: see ``write_run_settings``)."""
    try:
        write_run_settings(directory, cfg, note=f"the settings evaluation reads, written for the cold start {key}")
    except OSError as exc:  # a read-only shared cache: evaluation then needs --run-config or flags
        log.warning("sft: could not write %s/run_config.json (%s); evaluate it with --run-config", directory, exc)


def _build(cfg: DictConfig, model_path: str, out: Path, inputs: dict, loggers: list) -> dict:
    import lightning.pytorch as pl
    from transformers import AutoTokenizer

    from score_lightning.policy.models import load_policy, load_tokenizer
    from score_lightning.retrieval.from_config import retriever_from_config

    s = cfg.sft
    t0 = time.perf_counter()
    pl.seed_everything(int(s.seed), workers=True, verbose=False)
    tokenizer = load_tokenizer(model_path, chat_template=cfg.model.chat_template)
    retriever = retriever_from_config(cfg.retriever, cfg.paths.cache_dir)
    demos, info = build_sft_demos(cfg, tokenizer, retriever)
    if not demos:
        raise RuntimeError("sft: no demonstrations fit the budgets; raise solver/evaluator budgets or disable sft")
    t_demos = time.perf_counter() - t0
    log.info("sft: %d demonstrations in %.1fs (%s)", len(demos), t_demos,
             ", ".join(f"{k}={v}" for k, v in info["built"].items()))
    lora = OmegaConf.to_container(s.lora, resolve=True)
    model = load_policy(model_path, str(cfg.model.dtype), bool(cfg.model.gradient_checkpointing),
                        lora=lora)  # sft.lora.enabled: only adapters train, packaged as the adapter alone
    top = s.trainable_layers
    if top is not None:  # the cold start trains what RL trains: below them no graph, no recomputation, no backward
        from score_lightning.policy.top_layers import train_top_layers

        try:
            trained = train_top_layers(model, int(top))
        except ValueError as exc:
            raise ValueError(f"sft.trainable_layers={top}: {exc}") from None
        log.info("sft: training the top %d decoder layers and the final norm (%d tensors)", int(top), len(trained))
    trainer_kwargs = {"accelerator": str(cfg.trainer.accelerator), "devices": 1,
                      "enable_progress_bar": bool(cfg.trainer.enable_progress_bar)}
    metrics = train_sft(model, demos, tokenizer.pad_token_id, s, trainer_kwargs, loggers or False)
    metrics["sft/demos_s"] = t_demos
    metrics["sft/num_demos"] = float(len(demos))
    probe = s.probe
    if int(probe.num_rubrics) > 0 or int(probe.num_solver) > 0:
        tp = time.perf_counter()
        pm = probe_policy(model, tokenizer, retriever, cfg, int(probe.num_rubrics), int(probe.num_solver),
                          seed=int(s.seed), n_scoring=int(probe.num_scoring))
        pm.pop("probe/rubric_errors", None)
        metrics.update({f"sft/{k}": v for k, v in pm.items()})
        metrics["sft/probe_s"] = time.perf_counter() - tp
        log.info("sft probe: %s", ", ".join(f"{k}={v:.2f}" for k, v in pm.items()))
    getattr(retriever, "close", lambda: None)()  # an MCP stdio server ends with the demonstrations, not the process
    metrics["sft/total_s"] = time.perf_counter() - t0
    if bool(s.log_samples):
        _log_summary(loggers, {}, _sample_texts(demos, tokenizer), str(cfg.paths.output_dir))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".tmp-sft-"))
    meta = {"inputs": inputs, "metrics": metrics, "demos": info, "base_model": str(model_path)}
    try:
        from score_lightning.policy.lora import is_lora

        if is_lora(model):  # merged weights for RL, adapter/ for the package
            from score_lightning.sft.adapter_asset import save_cold_start

            save_cold_start(model, tmp)
        else:
            model.save_pretrained(tmp, safe_serialization=True)
        AutoTokenizer.from_pretrained(str(model_path)).save_pretrained(tmp)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True, default=str))
        _record_settings(tmp, cfg, out.name)
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
