"""Two "nodes" on one machine: docs/RECIPES.md's torchrun command, run as two launchers over loopback.

Each launcher is ``torchrun --nnodes=2 --nproc-per-node=1 --node-rank=N --master-addr=127.0.0.1
--master-port=P src/train.py ... trainer.num_nodes=2``, docs/RECIPES.md's multi-node command with the host
name replaced, so a SCORE step really crosses a (gloo) process group built by torchrun's static
rendezvous, and Lightning picks its ranks from torchrun's environment (``TorchElasticEnvironment``:
``trainer.devices`` must equal ``--nproc-per-node`` and ``devices x num_nodes`` the world size).
Both write one shared ``paths.output_dir``; a relaunch with ``ckpt_path=.../last.ckpt`` resumes.
docs/RECIPES.md's srun command is run the same way, its two tasks given the variables srun would set.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import FAST, ROOT, read_scalars

#: FAST on 2 data-parallel processes: the global batch (2 queries) splits into one query per rank
COMMON = FAST + ["rollout=scripted", "strategy=ddp", "trainer.devices=1", "trainer.num_nodes=2", "data.batch_size=2",
                 "optim.mini_batch_size=2", "solver.max_response_tokens=120", "evaluator.max_response_tokens=240",
                 "evaluator.max_rubric_tokens=120", "harness.every_n_steps=10"]
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_", "TORCHELASTIC"))}
    return dict(env, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1", **extra)


def _launch_two_nodes(args: list[str], launcher: str = "torchrun") -> None:
    """Start node ranks 0 and 1 as docs/RECIPES.md does on two hosts; both must exit 0.

    ``torchrun``: docs/RECIPES.md's torchrun command. ``srun``: its srun payload
    (``python src/train.py ...``) with the variables srun sets for task N of
    ``--nodes=2 --ntasks-per-node=1``, which Lightning's ``SLURMEnvironment`` reads.
    """
    port = str(_free_port())
    if launcher == "torchrun":
        cmds = [([TORCHRUN, "--nnodes=2", "--nproc-per-node=1", f"--node-rank={rank}", "--master-addr=127.0.0.1",
                  f"--master-port={port}", "src/train.py", *args], _env()) for rank in (0, 1)]
    else:
        slurm = dict(SLURM_JOB_ID="4242", SLURM_JOB_NAME="score", SLURM_NTASKS="2", SLURM_NTASKS_PER_NODE="1",
                     SLURM_NNODES="2", SLURM_NODELIST="127.0.0.1", SLURM_LOCALID="0", MASTER_PORT=port)
        cmds = [([sys.executable, "src/train.py", *args], _env(**slurm, SLURM_PROCID=str(r), SLURM_NODEID=str(r)))
                for r in (0, 1)]
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for cmd, env in cmds]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=600)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"node rank {rank} exited {p.returncode}:\n{out[-4000:]}"


@pytest.mark.multiprocess  # two or more training processes: make test-multiprocess (CI runs it)
def test_two_torchrun_nodes_train_checkpoint_and_resume(tmp_path, tiny_ckpt, corpus_file):
    out = tmp_path / "run"  # one folder both nodes write (a shared file system on a real cluster)
    _launch_two_nodes(COMMON + ["trainer.max_steps=2", f"paths.output_dir={out}"])
    ckpt = out / "checkpoints" / "last.ckpt"
    state = torch.load(ckpt, weights_only=True, map_location="cpu")
    assert state["score"]["score_step"] == 2
    assert (out / "export" / "config.json").is_file()
    steps = sorted({s for s, _ in read_scalars(out / "tensorboard")["solver/reward_mean"]})
    assert steps == [0, 1]

    _launch_two_nodes(COMMON + ["trainer.max_steps=3", f"paths.output_dir={out}", f"ckpt_path={ckpt}"])
    assert torch.load(ckpt, weights_only=True, map_location="cpu")["score"]["score_step"] == 3
    steps = sorted({s for s, _ in read_scalars(out / "tensorboard")["solver/reward_mean"]})
    assert steps == [0, 1, 2]  # one continuous curve in the shared folder


@pytest.mark.multiprocess  # two or more training processes: make test-multiprocess (CI runs it)
def test_two_srun_tasks_train_and_checkpoint(tmp_path, tiny_ckpt, corpus_file):
    out = tmp_path / "run"
    _launch_two_nodes(COMMON + ["trainer.max_steps=2", f"paths.output_dir={out}"], launcher="srun")
    assert torch.load(out / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")["score"]["score_step"] == 2
    assert sorted({s for s, _ in read_scalars(out / "tensorboard")["solver/reward_mean"]}) == [0, 1]
