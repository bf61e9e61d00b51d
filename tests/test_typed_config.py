"""The typed config: every problem of a command line in one ``error: invalid config:`` block, each naming its key,
what is allowed and, for an unknown key, the nearest known one; within seconds, exit 2, no traceback."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from helpers import ROOT, compose, refusal

CASES = {
    "wrong type": (["solver.num_rollouts=four"], ["solver.num_rollouts=four: allowed an integer"]),
    "out of its set": (["evaluator.scoring=listwise"],
                       ["evaluator.scoring='listwise': allowed one of: joint, pointwise"]),
    "not a registered name": (["optim.loss_type=ppo"],  # a registry's set, read from the declared names, no torch
                              ["optim.loss_type='ppo': allowed bnpo, cispo, dapo, dr_grpo, grpo, grpo_seq_mean, gspo "
                               "(a method declares its names in its config.py, NAMES)"]),
    "out of its range": (["evaluator.ema_beta=1.5"], ["evaluator.ema_beta=1.5: allowed a number >= 0 and < 1"]),
    "unknown key": (["solver.num_rollout=4"], ["solver.num_rollout: unknown key; did you mean `solver.num_rollouts`?"]),
    "unknown key with +": (["+solver.num_rollout=4"],
                           ["solver.num_rollout: unknown key; did you mean `solver.num_rollouts`?"]),
    "key in the wrong group": (["solver.ema_beta=0.5"],
                               ["solver.ema_beta: unknown key; did you mean `evaluator.ema_beta`?"]),
    "removed key": (["loss.clip_ratio_high=0.28"], ["loss.clip_ratio_high: removed; use optim.clip_ratio_high"]),
    "cross-key rule": (["optim.mini_batch_size=3"], ["optim.mini_batch_size=3: must be <= data.batch_size=2"]),
    "three problems": (["solver.num_rollouts=four", "+optim.lr_warmup=3", "optim.mini_batch_size=3"],
                       ["solver.num_rollouts=four: allowed an integer", "optim.lr_warmup: unknown key",
                        "optim.mini_batch_size=3: must be <= data.batch_size=2"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_cli_refuses_each_problem_by_name_in_seconds(case, tmp_path):
    overrides, lines = CASES[case]
    t0 = time.time()
    proc = subprocess.run([sys.executable, "src/train.py", "experiment=tiny_score", *overrides,
                           f"paths.output_dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    took = time.time() - t0
    err = proc.stderr
    assert proc.returncode == 2, err[-2000:]
    assert err.startswith("error: invalid config:") and "Traceback" not in err + proc.stdout, err[-2000:]
    for line in lines:
        assert f"  - {line}" in err, err
    assert err.count("\n  - ") == len(lines), err  # each problem once, nothing else
    assert took < 5.0, f"{case}: {took:.1f} s"


def test_a_typo_suggested_with_plus_is_not_silently_ignored():
    """Hydra answers ``solver.num_rollout=4`` with 'use +solver.num_rollout=4'; that must not run with the default K."""
    text = refusal(["experiment=tiny_score", "+solver.num_rollout=4"])
    assert "did you mean `solver.num_rollouts`" in text


def test_every_group_is_typed_and_its_options_refuse_keys_they_do_not_read():
    from omegaconf import OmegaConf

    cfg = compose(["experiment=tiny_score"])
    for group in ("threads", "actor", "solver", "evaluator", "verifier", "reward", "loss", "optim", "model", "data",
                  "judge", "harness", "sft", "trainer", "paths", "rollout", "retriever", "strategy", "rubric"):
        assert OmegaConf.get_type(cfg[group]).__name__.endswith("Config"), group
    assert OmegaConf.get_type(cfg.solver.mams).__name__ == "MamsRoleBudgets"  # a method's node, from its folder
    assert "retriever.timeout_s: unknown key" in refusal(["experiment=tiny_score", "+retriever.timeout_s=3"])
    compose(["experiment=tiny_score", "retriever=http", "retriever.timeout_s=3"])  # http reads it


def test_user_callbacks_and_loggers_stay_open():
    cfg = compose(["experiment=tiny_score", "+callbacks.mine._target_=helpers.RecordingCallback"])
    assert cfg.callbacks.mine._target_ == "helpers.RecordingCallback"


def test_a_stored_config_from_before_the_removed_keys_reads_as_it_ran():
    from score_lightning.evaluation.stored_config import upgrade_stored_config

    old = {"loss": {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "norm_adv_by_std": False, "kl_coef": 0.05},
           "optim": {"clip_ratio_low": "${loss.clip_ratio_low}", "warmup_ratio": None, "lr": 1e-5}}
    new = upgrade_stored_config(old)
    assert new.optim.clip_ratio_low == 0.2 and new.optim.clip_ratio_high == 0.28
    assert new.optim.scale_rewards == "none" and "warmup_ratio" not in new.optim
    assert "clip_ratio_low" not in new.loss and new.loss.kl_coef == 0.05


def test_the_names_the_checks_know_without_torch_are_the_registries_names():
    """The config checks accept a registered name from the schema (the core's) and the methods' config modules
    without importing torch; a name either forgets would be refused or would cost the registry import."""
    code = ("from score_lightning.launch.schema import LIVE_REGISTRIES, known_names, live_names\n"
            "bad = {k: (sorted(known_names(k)), live_names(k)) for k in LIVE_REGISTRIES\n"
            "       if known_names(k) != set(live_names(k))}\n"
            "assert not bad, bad\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_config_checks_load_no_torch():
    code = ("import sys\nfrom score_lightning.launch.config_check import check_command_line\n"
            "from score_lightning.errors import ConfigError\n"
            "try:\n    check_command_line(['experiment=tiny_score', 'optim.mini_batch_size=3'])\n"
            "except ConfigError as e:\n    print(e)\n"
            "print('torch' in sys.modules, 'transformers' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT / "src")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "optim.mini_batch_size=3: must be <= data.batch_size" in proc.stdout
    assert proc.stdout.strip().endswith("False False"), proc.stdout
