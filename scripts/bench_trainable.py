#!/usr/bin/env python
"""What a GRPO update costs when all weights, LoRA adapters or only the top N layers train, on the same rows.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/bench_trainable.py --model smollm2_135m --top 2,6 --reps 2

Each mode runs in its own process (a clean peak RSS) on identical rows: ``--prompts`` solver prompts of
the experiment (``smol_score`` by default) with K responses each, whose ids are consecutive slices of
``--response-tokens`` of the tokenised corpus, every reward different so every row has an advantage. One call of the
project's ``solver_update`` (reference pass, forward, backward, one optimiser step; the experiment's
``optim.share_prompt_forward``) is timed ``--reps`` times after one warm-up. Modes: ``full`` (a second
frozen model for the KL reference), ``lora`` (``model.lora`` as the experiment sets it, enabled; the reference is the
base with adapters off) and ``topN`` (``model.trainable_layers=N``; the reference swaps in the top
layers' start). Learning per update: before the first update and after each, the advantage-weighted mean
response log-prob of the rows (``_objective``); ``--lrs`` runs every mode at each rate, since the modes'
best rates differ. Printed: a Markdown table and a ``key=value`` line. Equal work is asserted: the same
row digest and token count in every mode.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))
import bench_common as bc  # noqa: E402


def _overrides(a, mode: str) -> list[str]:
    over = [f"experiment={a.experiment}", f"model.name_or_path={a.model_path}", "sft.enabled=false"]
    if mode == "full":  # the experiment may train only its top layers (smol_score): every mode says what trains
        over += ["model.lora.enabled=false", "model.trainable_layers=null"]
    elif mode == "lora":
        over += ["model.lora.enabled=true", "model.trainable_layers=null"]
    elif mode.startswith("top"):
        over += ["model.lora.enabled=false", f"model.trainable_layers={int(mode[3:])}"]
    return over + list(a.overrides)


def worker(a) -> None:
    import torch

    from score_lightning.step.batching import build_token_batch
    from score_lightning.policy.models import load_policy, load_reference, load_tokenizer
    from score_lightning.paths import corpus_path
    from score_lightning.rollout.chat import encode_chat
    from score_lightning.step.losses import group_advantages
    from score_lightning.rollout.trajectory import Trajectory
    from score_lightning.step.rollout_correction import rollout_correction
    from score_lightning.step.solver_update import OptimizerHooks, grpo_settings, solver_update

    bc.set_threads(a.threads)
    cfg = bc.compose(_overrides(a, a.mode))
    bc.set_malloc(cfg)
    m = cfg.model
    tok = load_tokenizer(a.model_path)
    with open(corpus_path(cfg)) as f:
        text = "\n".join(json.loads(line)["contents"] for _, line in zip(range(400), f))
    corpus_ids = tok(text, add_special_tokens=False)["input_ids"]
    prompts = [encode_chat(tok, msgs) for msgs in bc.solver_chat(bc.bench_queries(a.prompts), cfg)]
    K = int(cfg.solver.num_rollouts)
    trajs = []
    for i in range(a.prompts * K):
        resp = corpus_ids[i * a.response_tokens: (i + 1) * a.response_tokens]
        trajs.append(Trajectory(prompts[i // K], resp, [1] * len(resp)))
    rewards = torch.linspace(0.1, 1.0, len(trajs))
    policy = load_policy(a.model_path, m.dtype, m.gradient_checkpointing, lora=m.get("lora"),
                         trainable_layers=m.get("trainable_layers"))
    ref = load_reference(a.model_path, m.dtype, policy, trainable_layers=m.get("trainable_layers"))
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=float(cfg.optim.lr))

    def step():
        opt.step()
        opt.zero_grad(set_to_none=True)
        return 0.0, True

    settings = grpo_settings(cfg.solver, cfg.optim, cfg.loss, cfg.reward,
                             rollout_correction(cfg.optim, cfg.loss, cfg.rollout))
    settings = type(settings)(**{**settings.__dict__, "mini_batch_queries": a.prompts})
    hooks = OptimizerHooks(lambda loss: loss.backward(), step, torch.device("cpu"))
    batch = build_token_batch([t.prompt_ids for t in trajs], [t.response_ids for t in trajs],
                              [t.response_mask for t in trajs], tok.pad_token_id)
    advantages = group_advantages(rewards, K)
    objective = [_objective(policy, batch, advantages, settings)]
    times = []
    for rep in range(a.reps + 1):
        t0 = time.perf_counter()
        solver_update(policy, ref, trajs, rewards, settings, tok.pad_token_id, hooks)
        if rep:
            times.append(time.perf_counter() - t0)
        objective.append(_objective(policy, batch, advantages, settings))  # outside the timed update
    print(json.dumps({"mode": a.mode, "times": times, "peak_rss_mb": bc.peak_rss_mb(),
                      "trainable": sum(p.numel() for p in params),
                      "total": sum(p.numel() for n, p in policy.named_parameters() if "lora_" not in n),
                      "digest": bc.ids_digest(batch.input_ids.tolist()),
                      "prompt_tokens": sum(len(t.prompt_ids) for t in trajs),
                      "response_tokens": sum(len(t.response_ids) for t in trajs),
                      "share_prompt": settings.share_prompt, "lr": float(cfg.optim.lr),
                      "gain": [j - objective[0] for j in objective[1:]]}))


def _objective(policy, batch, advantages, settings) -> float:
    """How far the update moved the policy towards its advantages on these rows: the advantage-weighted mean of
    each row's mean response log-prob, sum_i A_i * mean_t log pi(y_it) / N (no grad; it rises as the GRPO
    objective is climbed). Its gain per update, at the same rate, is what the modes learn from one batch."""
    import torch

    from score_lightning.step.batching import policy_logprobs

    was_training = policy.training
    policy.eval()
    with torch.no_grad():
        logp, _ = policy_logprobs(policy, batch, settings.temperature, share_prompt=settings.share_prompt)
    policy.train(was_training)
    mask = batch.loss_mask.float()
    per_row = (logp * mask).sum(1) / mask.sum(1).clamp(min=1)
    return float((advantages * per_row).mean())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2_135m", help="a model preset or a checkpoint directory")
    p.add_argument("--experiment", default="smol_score")
    p.add_argument("--top", default="2,6", help="comma-separated N for the top-N modes")
    p.add_argument("--modes", default="full,lora", help="other modes to run (full, lora)")
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--response-tokens", type=int, default=200)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--lrs", default="", help="comma-separated learning rates, every mode at each (default: the "
                                             "experiment's optim.lr)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--model-path", help=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*", help="Hydra overrides for every mode")
    a = p.parse_args(argv)
    if a.mode:
        return worker(a)
    print(bc.machine_line(), flush=True)
    path = str(bc.checkpoint(a.model))
    modes = [x for x in a.modes.split(",") if x] + [f"top{int(n)}" for n in a.top.split(",") if n]
    res = []
    lrs = [f"optim.lr={float(x)}" for x in a.lrs.split(",") if x] or [None]
    for mode in modes:
        for lr in lrs:
            argv = [sys.executable, __file__, "--mode", mode, "--model-path", path, "--experiment", a.experiment,
                    "--prompts", str(a.prompts), "--response-tokens", str(a.response_tokens), "--reps", str(a.reps),
                    "--threads", str(a.threads), *a.overrides, *([lr] if lr else [])]
            out = subprocess.run(argv, capture_output=True, text=True, env=bc.bench_env())
            if out.returncode:
                sys.exit(f"{mode} {lr or ''} failed:\n{out.stderr[-3000:]}")
            res.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"  {mode} lr {res[-1]['lr']:g}: {res[-1]['times']} s, peak {res[-1]['peak_rss_mb']:.0f} MiB, "
                  f"gain {res[-1]['gain']}", flush=True)
    if len({(r["digest"], r["response_tokens"]) for r in res}) != 1:
        sys.exit("equal work failed: the modes trained different rows")
    for r in res:  # each mode trained what it says: all weights, adapters only, or fewer than all
        if r["mode"] == "full" and r["trainable"] != r["total"] or r["mode"] != "full" and r["trainable"] >= r["total"]:
            sys.exit(f"mode {r['mode']} trained {r['trainable']} of {r['total']} parameters")
    r0 = res[0]
    print(f"\nGRPO update on {a.prompts} prompts x K rows ({r0['prompt_tokens']} prompt + {r0['response_tokens']} "
          f"response tokens), {a.model}, {a.experiment}, packed prompts: {r0['share_prompt']}, "
          f"{a.reps} timed reps after 1 warm-up, threads={a.threads}\n")
    n = len(r0["gain"])
    print(f"objective gain: sum_i A_i * mean log-prob(y_i) / N on these rows after 1..{n} updates, minus its value "
          f"before (compare modes at rates where they gain alike)\n")
    print("| mode | lr | trainable parameters | median update (s) | min–max (s) | peak RSS (MiB) | "
          f"objective gain after 1..{n} updates |")
    print("|---|---|---|---|---|---|---|")
    for r in res:
        print(f"| {r['mode']} | {r['lr']:g} | {r['trainable'] / 1e6:.1f} M | {statistics.median(r['times']):.1f} | "
              f"{min(r['times']):.1f}–{max(r['times']):.1f} | {r['peak_rss_mb']:.0f} | "
              f"{', '.join(f'{x:+.4f}' for x in r['gain'])} |")
    tag = (lambda r: f"{r['mode']}_{r['lr']:g}") if len(lrs) > 1 else (lambda r: r["mode"])
    print(bc.summary_line(**{f"{tag(r)}_s": statistics.median(r["times"]) for r in res},
                          **{f"{tag(r)}_peak_mb": r["peak_rss_mb"] for r in res},
                          **{f"{tag(r)}_gain": r["gain"][-1] for r in res}, equal_work="ok"))


if __name__ == "__main__":
    main()
