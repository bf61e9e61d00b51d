"""The paper's DPO baseline as a plug-in (issue 70): ``solver.objective=dpo`` trains the solver through the core's
solver-objective extension point, with no edit of the step.

* The update on a hand-made batch: which reports pair up (the best and the worst judged one of each query, an
  unjudged or excluded report in none), the loss and its gradient as the mean over the step's pairs by hand, the
  same gradient whatever the micro-batch size, and a step without a pair making no optimiser step.
* One real two-step run (scripted engine, real model, trainer and updates) of ``experiment=dpo_tiny``'s settings:
  the logged pair count, loss, margin and accuracy equal a hand computation from the step's rewards and the
  log-probs under the policy and the reference, and the update makes each chosen report more likely relative to
  its rejected one.
* ``src/train.py experiment=dpo_tiny`` from the command line, and an unknown or impossible ``solver.objective``
  refused by name. The loss itself equals TRL's: ``tests/test_dpo_loss.py``.
"""

from __future__ import annotations

import datetime
import gc
import math
import os
import subprocess
import sys

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from helpers import FAST, ROOT, compose, read_scalars, spawn_ranks
from score_lightning.data.datamodule import QueryStream
from score_lightning.data.queries import load_queries
from score_lightning.methods.dpo.objective import DPOObjective, DPOSettings
from score_lightning.rollout.scripted import ScriptedEngine
from score_lightning.rollout.trajectory import Trajectory
from score_lightning.step.scalars import StepScalars
from score_lightning.step.solver_objective import SOLVER_OBJECTIVES, SolverInputs
from score_lightning.step.solver_update import OptimizerHooks
from test_score_step import StepScript, _seq_logprob

BETA = 0.1


class _LM(torch.nn.Module):
    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.net = torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16))

    def forward(self, input_ids, attention_mask=None, **_):
        return type("Out", (), {"logits": self.net(input_ids)})()


def _trajectories() -> list[Trajectory]:
    """3 queries x K=3; uneven lengths, and a tool observation (mask 0) inside some responses."""
    out = []
    for i in range(9):
        n = 2 + i % 3
        response = [(3 + 5 * i + j) % 16 for j in range(n)]
        mask = [1] * n
        if i % 2:
            mask[1] = 0  # an observation token: written by the tool, in no log-prob sum
        out.append(Trajectory([1, 2 + i % 2], response, mask))
    return out


#: q0 pairs row 1 (0.9) over row 0 (0.2); q1's best (row 4) leaves the update, the rest tie: no pair;
#: q2's best (row 7) is unjudged: row 8 (0.3) over row 6 (0.1)
REWARDS = torch.tensor([0.2, 0.9, 0.5, 0.4, 0.8, 0.4, 0.1, 0.7, 0.3])
JUDGED = torch.tensor([True] * 7 + [False, True])
EXCLUDE = torch.tensor([False] * 4 + [True] + [False] * 4)
PAIRS = [(1, 0), (8, 6)]


def _hand_logp(model: torch.nn.Module, t: Trajectory) -> torch.Tensor:
    """log pi(response | prompt) over the tokens the model wrote, from the model's logits by hand."""
    ids = torch.tensor(t.prompt_ids + t.response_ids)
    logp = F.log_softmax(model.net(ids)[:-1], dim=-1).gather(1, ids[1:, None])[:, 0]
    start = len(t.prompt_ids) - 1
    return sum(logp[start + j] for j, m in enumerate(t.response_mask) if m)


def _update(micro: int, rewards: torch.Tensor = REWARDS):
    policy, ref = _LM(0), _LM(1)
    grads, steps = [], []

    def backward(loss):
        grads.append(torch.autograd.grad(loss, list(policy.parameters())))

    def step():
        steps.append([sum(g[i] for g in grads) for i in range(len(grads[0]))])
        grads.clear()
        return 1.0, True

    settings = DPOSettings(3, BETA, "sigmoid", 0.0, 1.0, micro, 1, False, False)
    inputs = SolverInputs(policy, ref, _trajectories(), rewards, JUDGED, torch.zeros(9, dtype=torch.bool), EXCLUDE,
                          None, 0, OptimizerHooks(backward, step, torch.device("cpu")), False)
    objective = DPOObjective(settings)
    result = objective.update(inputs)
    scalars = StepScalars()
    metrics = objective.record(scalars, result) | scalars.compute()
    return policy, ref, result, steps, metrics


def test_the_update_is_the_mean_over_the_steps_pairs_in_any_micro_batches():
    policy, ref, result, steps, metrics = _update(micro=2)  # one pair per micro-batch
    assert result.pairs == PAIRS
    trajs = _trajectories()
    with torch.no_grad():
        ref_lp = {i: _hand_logp(ref, trajs[i]) for pair in PAIRS for i in pair}
    deltas = [(_hand_logp(policy, trajs[c]) - ref_lp[c]) - (_hand_logp(policy, trajs[r]) - ref_lp[r]) for c, r in PAIRS]
    hand = sum(-F.logsigmoid(BETA * d) for d in deltas) / len(PAIRS)
    want = torch.autograd.grad(hand, list(policy.parameters()))
    assert len(steps) == 1 and result.updates == 1
    for got, exp in zip(steps[0], want):
        torch.testing.assert_close(got, exp, rtol=1e-5, atol=1e-7)
    _, _, _, whole, _ = _update(micro=100)  # every pair in one micro-batch: the same gradient
    for got, exp in zip(whole[0], want):
        torch.testing.assert_close(got, exp, rtol=1e-5, atol=1e-7)
    margins = [BETA * float(d.detach()) for d in deltas]
    assert metrics["solver/dpo_pairs"] == 2
    assert metrics["solver/dpo_loss"] == pytest.approx(float(hand.detach()), rel=1e-5)
    assert metrics["solver/dpo_reward_margin"] == pytest.approx(sum(margins) / 2, rel=1e-5)
    assert metrics["solver/dpo_reward_accuracy"] == pytest.approx(sum(m > 0 for m in margins) / 2)
    assert metrics["solver/updates"] == 1.0 and metrics["solver/grad_norm"] == 1.0


def _ddp_rank(rank: int, port: int, out: str) -> None:
    """One of two gloo ranks under real DDP: rank 0 holds q0 and q2 (a pair each), rank 1 q1 and a tied q3 (none)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))  # no hang
    policy, ref = DDP(_LM(0)), _LM(1)
    trajs = _trajectories()
    rows = [0, 1, 2, 6, 7, 8] if rank == 0 else [3, 4, 5, 0, 1, 2]
    rewards = REWARDS[rows] if rank == 0 else torch.tensor([0.4, 0.8, 0.4, 0.5, 0.5, 0.5])
    grads, calls = [], []

    def backward(loss):
        calls.append(1)
        loss.backward()

    def step():
        grads.append([p.grad.clone() for p in policy.parameters()])
        return 1.0, True

    inputs = SolverInputs(policy, ref, [trajs[r] for r in rows], rewards, JUDGED[rows] if rank == 0 else
                          torch.ones(6, dtype=torch.bool), None, EXCLUDE[rows] if rank == 0 else
                          torch.tensor([False, True] + [False] * 4), None, 0,
                          OptimizerHooks(backward, step, torch.device("cpu")), False)
    result = DPOObjective(DPOSettings(3, BETA, "sigmoid", 0.0, 1.0, 2, 1, False, False)).update(inputs)
    torch.save({"grads": grads[0], "calls": len(calls), "pairs": result.pairs}, f"{out}/rank{rank}.pt")
    # DDP's reducer freed after its process group is gone can sleep forever in its destructor at exit (1 run in
    # 6-16 here; 0 in 45 with this order): free it while the group lives
    del inputs, policy
    gc.collect()
    dist.destroy_process_group()


@pytest.mark.multiprocess  # two processes: make test-multiprocess (CI runs it)
def test_under_ddp_a_rank_without_pairs_keeps_step_and_the_gradient_is_the_global_mean(tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    spawn_ranks(_ddp_rank, (port, str(tmp_path)), [tmp_path / f"rank{r}.pt" for r in range(2)])
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert [r["pairs"] for r in ranks] == [[(1, 0), (5, 3)], []]
    assert ranks[0]["calls"] == ranks[1]["calls"] == 2  # two micro-batches on each rank: rank 1 backs zeros
    policy, ref = _LM(0), _LM(1)
    trajs = _trajectories()
    with torch.no_grad():
        ref_lp = {i: _hand_logp(ref, trajs[i]) for pair in PAIRS for i in pair}
    deltas = [(_hand_logp(policy, trajs[c]) - ref_lp[c]) - (_hand_logp(policy, trajs[r]) - ref_lp[r]) for c, r in PAIRS]
    want = torch.autograd.grad(sum(-F.logsigmoid(BETA * d) for d in deltas) / 2, list(policy.parameters()))
    for r in ranks:  # DDP's gradient mean over ranks is the mean over the step's two pairs
        for got, exp in zip(r["grads"], want):
            torch.testing.assert_close(got, exp, rtol=1e-5, atol=1e-7)


def test_a_step_without_a_pair_makes_no_optimiser_step_and_says_so():
    _, _, result, steps, metrics = _update(micro=2, rewards=torch.full((9,), 0.5))
    assert result.pairs == [] and steps == [] and result.updates == 0
    assert metrics["solver/dpo_pairs"] == 0.0 and metrics["solver/updates"] == 0.0
    assert math.isnan(metrics["solver/dpo_loss"])  # no pair: nothing was measured


# ---------------------------------------------------------------------------- a real run


def _dpo_overrides(out) -> list[str]:
    return [o for o in FAST if not o.startswith("experiment=")] + [
        "experiment=dpo_tiny", f"paths.output_dir={out}", "trainer.max_steps=2", "data.batch_size=2",
        "optim.mini_batch_size=2", "solver.num_rollouts=3", "optim.micro_batch_size=2",
        "solver.max_response_tokens=160", "evaluator.max_response_tokens=400", "evaluator.max_rubric_tokens=96",
        "reward.require_citation=true", "verifier.enabled=false", "optim.lr=1e-4", "optim.warmup_steps=0",
        "evaluator.scoring=joint"]


def test_a_dpo_step_moves_each_chosen_report_up_against_its_rejected_one(tmp_path, tiny_ckpt, corpus_file):
    from score_lightning.launch.training import run

    cfg = compose(_dpo_overrides(tmp_path))
    stream = QueryStream(load_queries(None, split="train"), 2, int(cfg.seed))
    script = StepScript(stream.batch(0)["prompt"], stream.batch(1)["prompt"])
    before, after, steps = [], [], []

    def logps(module, model) -> list[float]:
        tok, temp = module.tokenizer, float(module.cfg.solver.temperature)
        return [_seq_logprob(model, t.prompt_ids, t.response_ids, t.response_mask, tok.pad_token_id, temp)
                for t in module.step_rollouts.solver]

    class Keep(L.Callback):
        def on_train_batch_end(self, trainer, module, *args):
            steps.append(module.last_step)
            after.append(logps(module, module.policy))

    def install(module):
        module.engine = module.evaluator_engine = ScriptedEngine(module.tokenizer, script)
        # after the backward, before the optimiser step: the log-probs the loss saw
        module.pre_step_hook = lambda m, phase: before.append((logps(m, m.policy), logps(m, m.ref)))

    run(cfg, extra_callbacks=[Keep()], module_hook=install)
    assert len(steps) == 2 and len(before) == 2  # one optimiser step per SCORE step (optim.ppo_epochs=1)
    for t, step in enumerate(steps):
        rewards, judged, m = step["rewards"].rewards.tolist(), step["rewards"].judged, step["metrics"]
        pairs = []
        for q in range(2):  # per query, by hand: the best and the worst judged report, ties to the lowest row
            rows = [3 * q + j for j in range(3) if not judged or judged[3 * q + j]]
            best = max(rows, key=lambda r: (rewards[r], -r))
            worst = min(rows, key=lambda r: (rewards[r], r))
            if rewards[best] != rewards[worst]:
                pairs.append((best, worst))
        assert pairs and step["solver"].pairs == pairs, (rewards, judged)
        policy, ref = before[t]
        deltas = [(policy[c] - ref[c]) - (policy[r] - ref[r]) for c, r in pairs]
        assert m["solver/dpo_pairs"] == len(pairs)
        hand = sum(-math.log(1 / (1 + math.exp(-BETA * d))) for d in deltas) / len(pairs)
        assert m["solver/dpo_loss"] == pytest.approx(hand, rel=1e-4)
        assert m["solver/dpo_reward_margin"] == pytest.approx(BETA * sum(deltas) / len(pairs), rel=1e-3, abs=1e-6)
        assert m["solver/updates"] == 1.0 and m["solver/grad_norm"] > 0
        # the update makes the chosen report more likely relative to the rejected one (the reference is frozen)
        for c, r in pairs:
            assert after[t][c] - after[t][r] > policy[c] - policy[r], (t, c, r)
    assert steps[0]["metrics"]["solver/dpo_loss"] == pytest.approx(math.log(2), rel=1e-6)  # policy = reference


# ---------------------------------------------------------------------------- the command line


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    return subprocess.run([sys.executable, "src/train.py", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)


def test_dpo_tiny_trains_from_the_command_line(tmp_path, tiny_ckpt):
    out = tmp_path / "dpo_tiny"
    fast = [o for o in FAST if not o.startswith("experiment=")]
    proc = _cli("experiment=dpo_tiny", *fast, "rollout=scripted", "solver.num_rollouts=3", "trainer.max_steps=2",
                "solver.max_response_tokens=200", "evaluator.max_response_tokens=500",
                "evaluator.max_rubric_tokens=160", f"paths.output_dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    scalars = read_scalars(out / "tensorboard")
    for key in ("solver/dpo_pairs", "solver/updates", "solver/reward_mean"):
        values = [v for _, v in scalars[key]]
        assert len(values) == 2 and all(math.isfinite(v) for v in values), (key, values)
    assert sum(v for _, v in scalars["solver/dpo_pairs"]) > 0  # the scripted reports differ: DPO trained


def test_an_unknown_or_impossible_solver_objective_is_refused_by_name():
    from score_lightning.launch.config_validation import ConfigError, validate_config

    proc = _cli("experiment=dpo_tiny", "solver.objective=dop")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "error:" in proc.stderr
    assert "solver.objective='dop': allowed one of the registered solver objectives: dpo, grpo" in proc.stderr
    with pytest.raises(ConfigError) as refused:
        validate_config(compose(["experiment=dpo_tiny", "loss.kl_coef=0", "solver.dpo.label_smoothing=0.2",
                                 "solver.dpo.beta=0", "reward.step=rubric"]))
    text = str(refused.value)
    assert "solver.dpo.beta=0.0: allowed a number > 0" in text  # the schema's refusal (a float field)
    assert "solver.dpo.label_smoothing=0.2 with solver.dpo.loss_type=sigmoid" in text
    assert "solver.objective=dpo with loss.kl_coef=0" in text
    assert "solver.objective=dpo with reward.step=rubric" in text
    validate_config(compose(["experiment=dpo_tiny", "solver.dpo.loss_type=robust", "solver.dpo.label_smoothing=0.2"]))
    assert {"dpo", "grpo"} <= set(SOLVER_OBJECTIVES.names())


@pytest.mark.multiprocess  # two training processes: make test-multiprocess (CI runs it)
def test_dpo_on_two_processes_matches_one_process(tmp_path, tiny_ckpt):
    """The pairs' mean is global: 2 DDP ranks (each with its own queries' pairs, a zero loss where one rank has
    fewer micro-batches) end with the weights of 1 process on the same global batch."""
    from safetensors.torch import load_file

    fast = [o for o in FAST if not o.startswith("experiment=")]
    common = ["experiment=dpo_tiny", *fast, "rollout=scripted", "data.batch_size=4", "optim.mini_batch_size=2",
              "solver.num_rollouts=3", "optim.micro_batch_size=2", "solver.max_response_tokens=200",
              "evaluator.max_response_tokens=400", "evaluator.max_rubric_tokens=160", "trainer.max_steps=2",
              "optim.lr=1e-4", "optim.warmup_steps=0", "callbacks.model_checkpoint.every_n_steps=100"]
    runs = {}
    for name, extra in (("single", ["strategy=single"]), ("ddp", ["strategy=ddp", "trainer.devices=2"])):
        proc = _cli(*common, *extra, f"paths.output_dir={tmp_path / name}")
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs[name] = (load_file(next((tmp_path / name / "export").glob("*.safetensors"))),
                      read_scalars(tmp_path / name / "tensorboard"))
    (w1, s1), (w2, s2) = runs["single"], runs["ddp"]
    assert sum(v for _, v in s1["solver/dpo_pairs"]) > 0, "no pair: the comparison would be vacuous"
    for tag in ("solver/dpo_pairs", "solver/dpo_loss", "solver/dpo_reward_margin"):
        assert [v for _, v in s2[tag]] == pytest.approx([v for _, v in s1[tag]], rel=1e-5, abs=1e-6), tag
    start = load_file(next(tiny_ckpt.glob("*.safetensors")))
    moved = max(float((w1[k] - start[k]).abs().max()) for k in w1)
    worst = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
    assert moved > 1e-4 and worst < 1e-5, (moved, worst)
