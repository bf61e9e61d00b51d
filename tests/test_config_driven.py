"""Callbacks, loggers and strategies are config-only changes; resume, export and refusals behave."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import FAST, ROOT, RecordingCallback, compose, read_scalars, recipe

STEP = FAST + ["rollout=scripted", "solver.num_rollouts=2", "solver.max_response_tokens=200",
               "evaluator.max_response_tokens=300", "evaluator.max_rubric_tokens=160"]


def _fit(out: Path, extra: list[str]):
    from score_lightning.launch.training import build_callbacks, run

    cfg = compose(STEP + [f"paths.output_dir={out}"] + extra)
    names = sorted(type(c).__name__ for c in build_callbacks(cfg))
    run(cfg)
    return names


def test_csv_logger_lr_monitor_and_user_callback_from_config(tmp_path, tiny_ckpt):
    RecordingCallback.batch_ends.clear()
    names = _fit(tmp_path / "csv", ["trainer.max_steps=2", "logger=csv",
                                    "+callbacks.lr_monitor._target_=lightning.pytorch.callbacks.LearningRateMonitor",
                                    "+callbacks.lr_monitor.logging_interval=step",
                                    "+callbacks.mine._target_=helpers.RecordingCallback", "~callbacks.collapse_guard"])
    assert "CollapseGuard" not in names and "LearningRateMonitor" in names and "RecordingCallback" in names
    assert RecordingCallback.batch_ends == [1, 2]  # the user's hook ran after each SCORE step
    rows = list(csv.DictReader(open(tmp_path / "csv" / "csv" / "metrics.csv")))
    header = set(rows[0])
    for tag in ("solver/reward_mean", "evaluator/consistency", "solver/entropy", "harness/version"):
        assert tag in header, tag
    assert any(k.startswith("lr-") for k in header), header
    assert [r["step"] for r in rows if r.get("solver/reward_mean")] == ["0", "1"]
    # no logger takes text: samples go to a file, never silently nowhere
    assert (tmp_path / "csv" / "text_samples.jsonl").read_text().count('"samples/trajectory"') >= 1
    assert not (tmp_path / "csv" / "tensorboard").exists()


def test_wandb_offline_writes_a_run(tmp_path, tiny_ckpt, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    _fit(tmp_path / "wb", ["trainer.max_steps=1", "logger=wandb", "logger.wandb.offline=true"])
    runs = list((tmp_path / "wb" / "wandb").glob("offline-run-*"))
    assert runs and list(runs[0].glob("*.wandb")), "no offline W&B run directory"


def test_the_manual_optimisation_checkpoint_warning_is_filtered_by_its_message(tmp_path, tiny_ckpt):
    """Lightning's 14-line ModelCheckpoint advice is not shown (the post-update state is what resume needs),
    and the filter still matches Lightning's text: if Lightning rewords it, this fails."""
    import inspect
    import re
    import warnings

    import lightning.pytorch.callbacks.model_checkpoint as mc

    from score_lightning.telemetry.console import MANUAL_CHECKPOINT_WARNING

    import ast

    # Lightning's warning texts as the interpreter joins their adjacent literals
    literals = [n.value for n in ast.walk(ast.parse(inspect.getsource(mc)))
                if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    assert any(re.match(MANUAL_CHECKPOINT_WARNING, s) for s in literals)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _fit(tmp_path / "quiet", ["trainer.max_steps=2", "callbacks.model_checkpoint.every_n_steps=1"])
    texts = [str(w.message) for w in seen]
    assert not [m for m in texts if "pre-optimization state" in m], texts
    assert (tmp_path / "quiet" / "checkpoints" / "last.ckpt").is_file()


def test_tensorboard_histograms_and_score_layout(tmp_path, tiny_ckpt):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _fit(tmp_path / "tb", ["trainer.max_steps=1"])
    events = next((tmp_path / "tb" / "tensorboard").glob("events.out.tfevents.*"))
    ea = EventAccumulator(str(events), size_guidance={"histograms": 0})
    ea.Reload()
    assert {"hist/reward", "hist/advantage", "hist/response_len", "hist/tool_calls"} <= set(ea.Tags()["histograms"])
    layout = ea.PluginTagToContent("custom_scalars")
    assert layout, "no SCORE custom-scalars layout"


def test_required_callbacks_are_refused_by_name(tmp_path):
    from score_lightning.launch.config_validation import ConfigError
    from score_lightning.launch.training import build_callbacks

    with pytest.raises(ConfigError, match="callbacks.preemption: required"):
        build_callbacks(compose(STEP + ["~callbacks.preemption"]))
    with pytest.raises(ConfigError, match="callbacks.mine: cannot build no.such.Callback"):
        build_callbacks(compose(STEP + ["+callbacks.mine._target_=no.such.Callback"]))


def test_ckpt_path_last_resumes_into_one_continuous_curve(tmp_path, tiny_ckpt):
    from score_lightning.launch.training import run

    common = STEP + [f"paths.log_dir={tmp_path}", "task_name=resume", "callbacks.model_checkpoint.every_n_steps=1"]
    run(compose(common + ["trainer.max_steps=2"]))
    runs = list((tmp_path / "resume").iterdir())
    assert len(runs) == 1
    run(compose(common + ["trainer.max_steps=3", "ckpt_path=last"]))
    assert [p.name for p in (tmp_path / "resume").iterdir()] == [runs[0].name], "the resume started a new run folder"
    steps = [s for s, _ in read_scalars(runs[0] / "tensorboard")["solver/reward_mean"]]
    assert steps == [0, 1, 2]


def test_export_script_rebuilds_the_exported_policy(tmp_path, tiny_ckpt):
    out = tmp_path / "run"
    _fit(out, ["trainer.max_steps=1", "optim.lr=1e-3"])
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, "scripts/export.py", str(out / "checkpoints" / "last.ckpt"),
                           str(tmp_path / "again")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a = load_file(next((out / "export").glob("*.safetensors")))
    b = load_file(next((tmp_path / "again").glob("*.safetensors")))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (tmp_path / "again" / "tokenizer.json").exists()
    # the export carries the run's config: evaluation takes the solver budgets from it
    from score_lightning.evaluation import _run_budgets

    budgets = _run_budgets(str(out / "export"))
    record = json.loads((out / "export" / "environment.json").read_text())  # versions and CPU beside the weights
    assert record["packages"]["torch"] == torch.__version__ and record["torch_cpu_capability"]
    cfg = compose(STEP)
    assert budgets == {"max_tool_calls": cfg.solver.max_tool_calls, "max_response_tokens": cfg.solver.max_response_tokens,
                       "max_observation_tokens": cfg.solver.max_observation_tokens, "topk": cfg.solver.topk}
    # scripts/export.py writes the same settings beside the policy, so evaluating its output samples as the run did
    assert _run_budgets(str(tmp_path / "again")) == budgets
    assert json.loads((tmp_path / "again" / "run_config.json").read_text()) == \
        json.loads((out / "export" / "run_config.json").read_text())


def _cli(args: list[str], tmp_path: Path, **env_vars: str) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.time()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), **env_vars)
    proc = subprocess.run([sys.executable, "src/train.py", *args, f"paths.output_dir={tmp_path}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    return proc, time.time() - t0


def test_refused_config_is_one_error_block_without_traceback(tmp_path):
    proc, took = _cli(["experiment=tiny_score", "solver.num_rollouts=1"], tmp_path)
    assert proc.returncode == 2 and took < 30
    assert "error:" in proc.stderr and "solver.num_rollouts=1" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_dead_retriever_fails_fast_naming_the_url(tmp_path):
    proc, took = _cli(["experiment=tiny_score", "retriever=http", "retriever.url=http://127.0.0.1:9/retrieve",
                       "retriever.max_retries=1", "trainer.max_steps=2"], tmp_path)
    assert proc.returncode == 2 and took < 30, (proc.returncode, took)
    assert "http://127.0.0.1:9/retrieve" in proc.stderr and "retriever=bm25" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("offline, endpoint, says", [
    ("1", None, "offline mode (HF_HUB_OFFLINE) forbids downloading it"),
    # downloads allowed, no network: a closed local port stands for a machine without one
    ("0", "http://127.0.0.1:9", "http://127.0.0.1:9 is unreachable"),
])
def test_an_unloadable_hub_model_is_one_error_block_naming_the_key(tmp_path, offline, endpoint, says):
    """The 1-GPU recipe on a machine without its model: refused in seconds, before torch loads, no traceback."""
    env = {"HF_HUB_OFFLINE": offline, "HF_HUB_CACHE": str(tmp_path / "empty_hf_cache")}
    if endpoint:
        env["HF_ENDPOINT"] = endpoint
    proc, took = _cli([*recipe("qwen_score_1gpu")], tmp_path, **env)
    assert proc.returncode == 2 and took < 30, (proc.returncode, took, proc.stderr[-2000:])
    assert "error: model.name_or_path='Qwen/Qwen2.5-0.5B-Instruct' cannot load:" in proc.stderr
    assert says in proc.stderr and "fix: point it at a local checkpoint directory" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_scheduler_before_optimiser_warning_is_filtered_and_still_matches_torch():
    """Schedules count SCORE steps, so a step without an optimiser step (the evaluator's every U steps) still
    steps them: torch's advice is not for this trainer. If torch rewords it, the filter stops matching: this fails."""
    import ast
    import inspect
    import re
    import warnings

    import torch.optim.lr_scheduler as lrs

    from score_lightning.telemetry.console import SCHEDULER_FIRST_WARNING, quiet_console

    literals = [n.value for n in ast.walk(ast.parse(inspect.getsource(lrs)))
                if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    assert any(re.match(SCHEDULER_FIRST_WARNING, s) for s in literals)
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        sched.step()  # unfiltered: torch warns
    assert any(re.match(SCHEDULER_FIRST_WARNING, str(w.message)) for w in seen)
    sched = torch.optim.lr_scheduler.LambdaLR(torch.optim.AdamW(model.parameters(), lr=1e-3), lambda s: 1.0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_console()
        sched.step()
    assert not [w for w in seen if re.match(SCHEDULER_FIRST_WARNING, str(w.message))]
