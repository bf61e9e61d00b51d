"""The supervised cold start's training and cache: SFT lowers the loss on a fixed batch, its output is cached
by its inputs (and keeps the RNG), and a top-layers cold start trains only the top and has its own key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf, open_dict

ROOT = Path(__file__).resolve().parents[1]


def _cfg(tmp_path: Path, corpus_file: Path, cache_dir: Path, **sft):
    from helpers import compose

    cfg = compose(["experiment=tiny_score", f"paths.output_dir={tmp_path / 'run'}", f"paths.cache_dir={cache_dir}",
                   f"retriever.corpus_path={corpus_file}", f"retriever.index_dir={cache_dir / 'bm25'}",
                   "solver.max_response_tokens=384", "evaluator.max_rubric_tokens=192",
                   "evaluator.max_response_tokens=768", "trainer.enable_progress_bar=false"])
    base = OmegaConf.load(ROOT / "configs" / "sft" / "default.yaml")
    with open_dict(cfg):
        cfg.sft = OmegaConf.merge(base, cfg.get("sft") or {}, {
            "enabled": True, "num_solver_demos": 3, "num_rubric_demos": 4, "num_scoring_demos": 1,
            "responses_per_prompt": {"solver": 2, "rubric": 4, "scoring": 1}, "log_every_n_steps": 1,
            "epochs": 1, "batch_size": 2, "lr": 3e-3, "warmup_steps": 0, "cache_dir": str(tmp_path / "sft-cache"),
            "probe": {"num_rubrics": 0, "num_solver": 0, "num_scoring": 0}, **sft})
    return cfg


def test_sft_training_lowers_the_loss_on_a_fixed_batch(tmp_path, tiny_ckpt, tokenizer, bm25, corpus_file, cache_dir):
    from score_lightning.policy.models import load_policy
    from score_lightning.sft.module import collate_demos, masked_lm_loss
    from score_lightning.sft.train import build_sft_demos, train_sft

    cfg = _cfg(tmp_path, corpus_file, cache_dir, num_solver_demos=2, num_rubric_demos=4, num_scoring_demos=0)
    demos, info = build_sft_demos(cfg, tokenizer, bm25)
    assert len(demos) == 6 and len({d.group for d in demos}) == 2
    batch = collate_demos(demos, tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = load_policy(tiny_ckpt)
    with torch.no_grad():
        before, _, n = masked_lm_loss(model, batch)
    assert n == sum(sum(d.response_mask) for d in demos)  # observation tokens are not trained
    with open_dict(cfg):
        cfg.sft.epochs = 4
        cfg.sft.batch_size = 2
    metrics = train_sft(model, demos, tokenizer.pad_token_id, cfg.sft,
                        {"accelerator": "cpu", "devices": 1, "enable_progress_bar": False}, logger=False)
    with torch.no_grad():
        after, _, _ = masked_lm_loss(model, batch)
    assert metrics["sft/steps"] == 4
    assert float(after) < float(before) - 0.5, (float(before), float(after))


def test_run_sft_caches_by_inputs_and_keeps_the_rng(tmp_path, tiny_ckpt, corpus_file, cache_dir, monkeypatch):
    import score_lightning.sft.run as R
    from helpers import read_scalars
    from score_lightning.policy.models import load_tokenizer
    from score_lightning.sft import run_sft
    from score_lightning.sft.cache import META_FILE, sft_output_path
    from score_lightning.sft.demos import DEMO_VERSION

    cfg = _cfg(tmp_path, corpus_file, cache_dir)
    torch.manual_seed(5)
    out = run_sft(cfg, str(tiny_ckpt))
    after_sft = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(after_sft, torch.rand(3)), "SFT must not move the RL run's RNG"
    assert (out / "config.json").is_file() and (out / META_FILE).is_file()
    assert out.parent == tmp_path / "sft-cache" and not list(out.parent.glob(".tmp-sft-*"))
    load_tokenizer(out)  # RL loads its tokenizer from here
    meta = json.loads((out / META_FILE).read_text())
    assert meta["inputs"]["demo_version"] == DEMO_VERSION and meta["metrics"]["sft/steps"] >= 1
    scalars = read_scalars(tmp_path / "run" / "tensorboard" / "sft")
    assert "sft/loss" in scalars and "sft/token_acc" in scalars

    # unchanged inputs: the cache is reused and nothing is trained
    def boom(*a, **k):
        raise AssertionError("train_sft must not run on a cache hit")

    monkeypatch.setattr(R, "train_sft", boom)
    assert run_sft(cfg, str(tiny_ckpt)) == out
    hits = [v for _, v in read_scalars(tmp_path / "run" / "tensorboard" / "sft")["sft/summary/cache_hit"]]
    assert sorted(hits) == [0.0, 1.0]  # the reuse is logged
    with open_dict(cfg):
        cfg.sft.probe.num_rubrics = 3  # not a weight-changing knob
        cfg.sft.log_every_n_steps = 1
    assert run_sft(cfg, str(tiny_ckpt)) == out
    # any input that changes the weights changes the key
    with open_dict(cfg):
        cfg.sft.lr = 1e-3
    assert sft_output_path(cfg, str(tiny_ckpt))[0] != out
    with open_dict(cfg):
        cfg.sft.lr = 3e-3
        cfg.solver.max_observation_tokens = 48
    assert sft_output_path(cfg, str(tiny_ckpt))[0] != out


def test_top_layers_cold_start_trains_only_the_top_and_is_keyed_apart(tmp_path, tiny_ckpt, corpus_file, cache_dir):
    """``sft.trainable_layers=N``: after the cold start the embeddings and bottom layers are the base's, bit for
    bit, and the top N layers and the final norm moved; it has its own cache key, and null keeps the old one."""
    from safetensors.torch import load_file

    from helpers import refusal
    from score_lightning.sft import run_sft
    from score_lightning.sft.cache import sft_key_inputs, sft_output_path

    cfg = _cfg(tmp_path, corpus_file, cache_dir, trainable_layers=1)
    everything = _cfg(tmp_path, corpus_file, cache_dir)
    assert sft_output_path(cfg, str(tiny_ckpt))[0] != sft_output_path(everything, str(tiny_ckpt))[0]
    # null leaves the knob out of the key: the key of a config from before the knob (the packaged cold starts')
    assert "trainable_layers" not in sft_key_inputs(everything, str(tiny_ckpt))["sft"]
    out = run_sft(cfg, str(tiny_ckpt))
    before, after = load_file(str(tiny_ckpt / "model.safetensors")), load_file(str(out / "model.safetensors"))
    n_layers = 1 + max(int(k.split(".")[2]) for k in before if k.startswith("model.layers."))
    top = f"model.layers.{n_layers - 1}."
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all(k.startswith(top) or k.startswith("model.norm.") for k in moved), sorted(moved)[:5]
    assert any(k.startswith("model.norm.") for k in moved) and any(k.startswith(top) for k in moved)
    for bad in ("sft.trainable_layers=0", "sft.trainable_layers=two", "sft.scoring_contrast=1.5"):
        assert bad.split("=")[0] in refusal(["experiment=tiny_score", bad])  # "two": refused as the line composes
    with open_dict(cfg):
        cfg.sft.trainable_layers = n_layers + 1
    with pytest.raises(ValueError, match=f"sft.trainable_layers={n_layers + 1}"):
        run_sft(cfg, str(tiny_ckpt))
