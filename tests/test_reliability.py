"""Faults a long RL run meets, exercised for real: dead retrieval, NaNs, SIGTERM, corrupt checkpoints."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback

from helpers import FAST, ROOT, compose, process_alive, read_scalars, train
from score_lightning.policy.checkpoint_io import CheckpointError, atomic_torch_save, validate_checkpoint


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(out: Path, extra: list[str], **kw):
    from score_lightning.launch.training import run

    return run(compose(FAST + [f"paths.output_dir={out}"] + extra), **kw)


# ---------------------------------------------------------------- checkpoints
def _fake_ckpt() -> dict:
    return {"state_dict": {"w": torch.ones(64, 64)}, "optimizer_states": [], "loops": {}, "score": {"score_step": 1}}


def test_truncated_checkpoint_is_refused(tmp_path):
    good = tmp_path / "good.ckpt"
    atomic_torch_save(_fake_ckpt(), good)
    validate_checkpoint(good)  # complete: accepted
    bad = tmp_path / "last.ckpt"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="corrupt or partial checkpoint"):
        validate_checkpoint(bad)
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {}}, foreign)
    with pytest.raises(CheckpointError, match=r"missing \['optimizer_states', 'loops', 'score'\]"):
        validate_checkpoint(foreign)


def test_cli_refuses_truncated_checkpoint_before_loading_models(tmp_path):
    good = tmp_path / "good.ckpt"
    atomic_torch_save(_fake_ckpt(), good)
    bad = tmp_path / "last.ckpt"
    bad.write_bytes(good.read_bytes()[:1000])
    t0 = time.time()
    proc = subprocess.run([sys.executable, "src/train.py", *FAST, f"ckpt_path={bad}", f"paths.output_dir={tmp_path}/o"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    err = proc.stderr + proc.stdout
    assert "ckpt_path=" in err and "corrupt or partial" in err
    assert "Loading weights" not in err and time.time() - t0 < 60


def test_interrupted_save_leaves_previous_checkpoint_intact(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    atomic_torch_save(_fake_ckpt(), path)
    before = path.read_bytes()

    def dying_save(obj, fh):
        fh.write(b"partial bytes")
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        atomic_torch_save({"new": 1}, path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # no temp file left behind


# ---------------------------------------------------------------- numerics
class WeightWatch(Callback):
    def __init__(self):
        self.before, self.after = {}, {}

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.before[module.score_step] = {k: v.detach().clone() for k, v in module.policy.state_dict().items()}

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.after[module.score_step - 1] = {k: v.detach().clone() for k, v in module.policy.state_dict().items()}


def test_nan_gradient_skips_update_without_touching_weights(tmp_path, tiny_ckpt):
    watch = WeightWatch()
    out = tmp_path / "nan"
    _run(out, ["trainer.max_steps=2", "debug.nan_grad_steps=[1]", "evaluator.enabled=false",
               "loss.entropy_coef=0.01", "optim.lr=1e-3"], extra_callbacks=[watch])
    changed = lambda a, b: any(not torch.equal(a[k], b[k]) for k in a)  # noqa: E731
    assert changed(watch.before[0], watch.after[0]), "a healthy step must move the weights"
    assert not changed(watch.before[1], watch.after[1]), "the poisoned step must leave the weights untouched"
    skipped = read_scalars(out / "tensorboard")["solver/skipped_steps"]
    assert [v for _, v in skipped] == [0.0, 1.0]


def test_repeated_nans_stop_the_run_with_a_checkpoint(tmp_path, tiny_ckpt):
    from score_lightning.errors import TrainingHalted

    out = tmp_path / "nan_halt"
    with pytest.raises(TrainingHalted, match="consecutive non-finite updates"):
        _run(out, ["trainer.max_steps=6", "debug.nan_grad_steps=[0,1,2,3]", "optim.max_consecutive_skips=1",
                   "evaluator.enabled=false"])
    ckpt = out / "checkpoints" / "last.ckpt"
    validate_checkpoint(ckpt)
    assert torch.load(ckpt, weights_only=True)["score"]["score_step"] == 2


# ---------------------------------------------------------------- retrieval outages
class KillAfter(Callback):
    def __init__(self, proc, step):
        self.proc, self.step = proc, step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if module.score_step == self.step and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _start_server(port: int, corpus: Path, index_dir: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "scripts/serve_retriever.py", "--corpus", str(corpus), "--index-dir",
                             str(index_dir), "--port", str(port)], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    import requests

    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).ok:
                return proc
        except requests.RequestException:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError("retrieval server did not start")


def test_retrieval_server_killed_mid_run(tmp_path, tiny_ckpt, corpus_file, cache_dir):
    from score_lightning.errors import TrainingHalted

    port = _free_port()
    server = _start_server(port, corpus_file, cache_dir / "bm25")
    out = tmp_path / "outage"
    try:
        with pytest.raises(TrainingHalted, match="every retrieval failed in 2 consecutive steps"):
            _run(out, ["retriever=http", f"retriever.url=http://127.0.0.1:{port}/retrieve", "retriever.max_retries=1",
                       "retriever.backoff_s=0.01", "retriever.timeout_s=2", "retriever.max_failed_steps=2",
                       "trainer.max_steps=8"], extra_callbacks=[KillAfter(server, 1)])
    finally:
        server.kill()
    errors = read_scalars(out / "tensorboard")["rollout/retrieval_errors"]
    steps = [v for _, v in errors]
    assert steps[0] == 0.0 and steps[-1] > 0  # healthy while the server lived, counted after it died
    assert len(steps) == 3  # step 1 healthy, steps 2 and 3 failed -> stopped after the second failure
    ckpt = out / "checkpoints" / "last.ckpt"
    assert torch.load(ckpt, weights_only=True)["score"]["score_step"] == 3


def test_dead_retriever_run_finishes_and_counts_errors(tmp_path, tiny_ckpt):
    """With the start-up probe off, a dead retriever is survived: failures are observations and counted."""
    out = tmp_path / "dead"
    train([*FAST, "retriever=http", "retriever.url=http://127.0.0.1:9/retrieve", "retriever.backoff_s=0.01",
           "retriever.probe_at_start=false", "trainer.max_steps=2", f"paths.output_dir={out}"])
    errors = [v for _, v in read_scalars(out / "tensorboard")["rollout/retrieval_errors"]]
    assert errors[-1] > 0


# ---------------------------------------------------------------- preemption
# async: also under make test-slow (36 s); its resume is covered by the SIGKILL test below and test_module
@pytest.mark.parametrize("mode", ["sync", pytest.param("async", marks=pytest.mark.slow)])
def test_sigterm_saves_exits_75_and_resume_completes(tmp_path, tiny_ckpt, mode):
    """Under rollout.mode=async the checkpoint also holds the batch the worker had in flight (and the worker,
    which ignores SIGTERM, is waited for rather than killed mid-batch)."""
    out = tmp_path / "preempt"
    cmd = [sys.executable, "src/train.py", *FAST, f"rollout.mode={mode}", "trainer.max_steps=40",
           f"paths.output_dir={out}", "callbacks.model_checkpoint.every_n_steps=100"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if "SCORE step 1 done" in line:
                t0 = time.time()
                proc.send_signal(signal.SIGTERM)
                break
        else:
            pytest.fail("training never reached step 1:\n" + "".join(seen[-30:]))
        rest, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 75, rest[-3000:]
    assert time.time() - t0 < 120
    ckpt = out / "checkpoints" / "last.ckpt"
    validate_checkpoint(ckpt)
    saved = torch.load(ckpt, weights_only=True)["score"]
    step = saved["score_step"]
    assert 1 <= step < 40  # the step in flight finished, nothing after it ran
    if mode == "async":
        from score_lightning.generation.batch_codec import decode

        batch = decode(saved["async_rollouts"]["batch"])
        assert (batch.step, batch.version) == (step, step - 1)  # the next step's batch, one version behind
    assert not (out / "export").exists()  # a preempted run does not pretend it finished
    done = subprocess.run(cmd[:-3] + [f"trainer.max_steps={step + 1}", f"paths.output_dir={out}",
                                      f"ckpt_path={ckpt}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert torch.load(ckpt, weights_only=True)["score"]["score_step"] == step + 1
    assert list((out / "export").glob("*.safetensors"))


# ---------------------------------------------------------------- SIGKILL under asynchronous rollouts


@pytest.mark.multiprocess  # two or more training processes: make test-multiprocess (CI runs it)
def test_sigkill_during_an_async_run_resumes_to_the_uninterrupted_run(tmp_path, tiny_ckpt):
    """SIGKILL the trainer while its worker generates, resume with ckpt_path=last: the end equals an
    uninterrupted asynchronous run of the same seed bit for bit (HF engine: the worker seeds each batch from
    (seed, step), and the checkpoint carries the batch in flight); the worker died with the trainer."""
    from safetensors.torch import load_file

    logs = tmp_path / "logs"
    cli = [sys.executable, "src/train.py", *FAST, "rollout.mode=async", "optim.lr=1e-3", "loss.entropy_coef=0.01",
           "callbacks.model_checkpoint.every_n_steps=1", "trainer.max_steps=5", f"paths.log_dir={logs}"]
    full = subprocess.run(cli + ["task_name=full"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert full.returncode == 0, full.stderr[-3000:]
    proc = subprocess.Popen(cli + ["task_name=killed"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    seen, worker = [], None
    try:
        for line in proc.stdout:
            seen.append(line)
            if "rollout worker started (pid " in line:
                worker = int(line.split("rollout worker started (pid ", 1)[1].split(",", 1)[0])
            if "SCORE step 2 done" in line:
                proc.send_signal(signal.SIGKILL)  # no handler, no atexit: only the worker's own watch can act
                break
        else:
            pytest.fail("training never reached step 2:\n" + "".join(seen[-30:]))
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGKILL and worker is not None
    deadline = time.time() + 10
    while process_alive(worker) and time.time() < deadline:
        time.sleep(0.1)
    assert not process_alive(worker), "the rollout worker outlived its SIGKILLed trainer"
    ckpts = list((logs / "killed").rglob("checkpoints/last.ckpt"))
    assert len(ckpts) == 1 and 1 <= torch.load(ckpts[0], weights_only=True)["score"]["score_step"] <= 3
    done = subprocess.run(cli + ["task_name=killed", "ckpt_path=last"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    a = load_file(next((logs / "full").rglob("export/*.safetensors")))
    b = load_file(next((logs / "killed").rglob("export/*.safetensors")))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # one continuous run folder: the resumed steps extend the killed run's curves, step for step
    curves = read_scalars(ckpts[0].parent.parent / "tensorboard")["rollout/staleness_max"]
    assert sorted({s for s, _ in curves}) == [0, 1, 2, 3, 4] and max(v for _, v in curves) == 1.0
