"""One GRPO training step: this project's solver phase (A) against TRL's ``GRPOTrainer`` (B), at equal work.

    HF_HUB_OFFLINE=1 python scripts/bench_step.py [--reps 5] [--k 4] [--prompts 4] [--max-completion 64]
                                                  [--scaling] [--logprobs fused|plain|legacy]
                                                  [--model tiny|smollm2_135m|PATH] [--gradient-checkpointing]
                                                  [--share-prompt] [--generator identical|own]

Both sides use the same checkpoint and tokenizer in float32 (``--model``: the tests' tiny checkpoint by
default, a model preset such as ``smollm2_135m``, or a checkpoint directory), ``--threads`` torch threads each,
the same ``--prompts`` embedded queries rendered through the solver chat template, ``K`` completions
per prompt, ``max_completion`` new tokens, one optimiser step over the whole batch (no gradient
accumulation, one PPO epoch, so neither side recomputes old log-probs), AdamW at the same lr with a
constant schedule, clipping at 1.0, a frozen reference with KL coefficient ``--beta``, clip ε 0.2, a
token-mean loss (TRL ``loss_type="dapo"``), sampling at temperature 1 with no top-k/top-p, stopping on
EOS or ``</answer>``, single-turn with no tools, gradient checkpointing off (``--gradient-checkpointing``:
on for both, TRL's own default), and the same fixed reward
of the completion ids (:func:`bench_common.reward_of_ids`). Workers: ``bench_step_workers.py``.

**Equal work, checked rather than assumed.** Before the first step each worker reports its settings;
the run stops unless both have gradient checkpointing as asked, the same two stop ids (TRL: its completion
mask's ``eos_token_ids`` and its ``generation_kwargs``), the same dtype and thread count and identical
prompt ids. After every step both report their prompt and completion token counts and a digest of
the completion ids; any difference is printed and the ratio is refused (``ratio_vs_trl=refused``).

**Generators** (``--generator``). ``identical`` (the default): both sides seed generation identically
each step and sample with HF ``generate``'s sampling (ours inside its ``HFEngine``), so they normally
draw the very same tokens; the count of steps with identical completion ids is printed. ``own``: each
side generates with its own engine, unseeded: ours with the trainer's ``HFEngine`` (``rollout=hf``:
in-place KV cache, each distinct prompt prefilled once for its K rows) at ``ignore_eos=True``, TRL
with its ``unwrapped_model.generate`` at ``generation_kwargs={"min_new_tokens": max_completion}``.
EOS and both stop ids are masked until the length on both sides, so every completion is forced to
exactly ``max_completion`` tokens. Equal work is then: the same prompts (digest), both sides reporting
that forced length before the first step, and at every step equal prompt and completion token counts,
each side's completion tokens being exactly prompts x K x ``max_completion``. The completion ids
differ between the sides in this mode, so their digests are not compared (neither mode requires them
equal; only token counts are checked).

A step runs from the step-begin hook (Lightning ``on_train_batch_start``, HF ``on_step_begin``) to
the step-end hook (after the optimiser step); only one side computes at a time, alternating A B B A.
The last line is ``ratio_vs_trl=X peak_ratio_vs_trl=Y equal_work=ok``: medians over repetitions of
ours/TRL step time, and ours/TRL peak RSS (lower is better). ``--scaling`` first runs the same pair
for K ∈ {2, 4, 8} × max response ∈ {64, 128, 256} (fresh workers per cell), in either generator mode.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common as bc  # noqa: E402
import bench_step_workers as bw  # noqa: E402

#: settings both workers report before the first step; all must agree
SETTINGS = ("gradient_checkpointing", "stop_ids", "dtype", "threads", "prompt_digest", "malloc", "forced_length")


def _worker_argv(side: str, a, **over) -> list[str]:
    v = vars(a) | over
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", side]
    for key in ("reps", "warmup", "k", "prompts", "max_completion", "lr", "beta", "threads", "logprobs", "model",
                "generator"):
        argv += [f"--{key.replace('_', '-')}", str(v[key])]
    return (argv + ["--gradient-checkpointing"] * bool(v["gradient_checkpointing"])
            + ["--share-prompt"] * bool(v.get("share_prompt")))


def settings_problems(ready: dict[str, dict], gradient_checkpointing: bool = False,
                      forced_length: int = 0) -> list[str]:
    """Differences in the equal-work settings the workers reported before their first step.

    ``forced_length``: the completion length both sides must force (``--generator own``: max_completion;
    0: neither forces one)."""
    ours, trl = ready["ours"], ready["trl"]
    problems = [f"{key}: ours {ours[key]!r} vs TRL {trl[key]!r}" for key in SETTINGS if ours[key] != trl[key]]
    if trl["generation_stop_ids"] != trl["stop_ids"]:
        problems.append(f"TRL generates with stop ids {trl['generation_stop_ids']} but masks at {trl['stop_ids']}")
    want = "on" if gradient_checkpointing else "off"
    problems += [f"{n}: gradient checkpointing is {'on' if r['gradient_checkpointing'] else 'off'}, asked {want}"
                 for n, r in ready.items() if r["gradient_checkpointing"] != gradient_checkpointing]
    problems += [f"{n}: forces completions to {r['forced_length']} tokens, asked {forced_length}"
                 for n, r in ready.items() if r["forced_length"] != forced_length]
    return problems


def step_problems(steps: dict[str, list[dict]], forced_tokens: int | None = None) -> list[str]:
    """Per-step differences in prompt or completion token counts (warm-up steps included).

    Completion digests are never compared (``--generator own`` draws different tokens on each side).
    ``forced_tokens`` (``--generator own``): the completion tokens every step of each side must have
    (prompts x K x max_completion); a side below it stopped some completion early."""
    out = []
    if len(steps["ours"]) != len(steps["trl"]):
        out.append(f"steps: ours {len(steps['ours'])} vs TRL {len(steps['trl'])}")
    for i, (o, t) in enumerate(zip(steps["ours"], steps["trl"])):
        tag = f"step {i} ({'warm-up' if o['rep'] < 0 else 'rep ' + str(o['rep'] + 1)})"
        for key in ("prompt_tokens", "completion_tokens", "prompt_digest"):
            if o[key] != t[key]:
                out.append(f"{tag}: {key} ours {o[key]} vs TRL {t[key]}")
        out += [f"{tag}: {name} wrote {r['completion_tokens']} completion tokens, forced {forced_tokens}"
                for name, r in (("ours", o), ("TRL", t))
                if forced_tokens is not None and r["completion_tokens"] != forced_tokens]
    return out


def _generators(a, res: dict, length: str | None = None) -> str:
    r = res["ready"]
    if a.generator == "identical":
        return f"identical tokens (same seeds; ours {r['ours']['generator']}, TRL {r['trl']['generator']})"
    return (f"each its own (ours {r['ours']['generator']}, TRL {r['trl']['generator']}), every completion forced "
            f"to {length or str(res['m']) + ' tokens'}")


def _show(name: str, tag: str, r: dict) -> None:
    print(f"  {tag:10s} {name:4s} {r['time_s']:7.3f} s  (rollout {r['rollout_s']:.3f} s, "
          f"{r['completion_tokens']} completion tokens, peak RSS {r['peak_rss_mb']:.0f} MiB)", flush=True)


def run_pair(a, **over) -> dict:
    """One A/B cell: both workers, alternating steps; returns the figures and the equal-work verdict."""
    c = argparse.Namespace(**(vars(a) | over))
    workers = {"ours": bc.Worker(_worker_argv("ours", c), "ours", bc.bench_env()),
               "trl": bc.Worker(_worker_argv("trl", c), "trl", bc.bench_env())}
    verbose = not a.scaling or over.get("verbose")
    try:
        ready = {name: w.expect("ready") for name, w in workers.items()}
        problems = settings_problems(ready, c.gradient_checkpointing, c.max_completion if c.generator == "own" else 0)
        if problems:
            raise SystemExit("equal-work settings differ, nothing measured:\n  " + "\n  ".join(problems))
        steps = bc.alternate(workers, c.warmup + c.reps, c.warmup, _show if verbose else None)
        done = {name: w.finish() for name, w in workers.items()}
    finally:
        for w in workers.values():
            w.kill()
    timed = {n: [r for r in rs if r["rep"] >= 0] for n, rs in steps.items()}
    ratios = [o["time_s"] / t["time_s"] for o, t in zip(timed["ours"], timed["trl"])]
    same = sum(o["completion_digest"] == t["completion_digest"] for o, t in zip(steps["ours"], steps["trl"]))
    forced = c.prompts * c.k * c.max_completion if c.generator == "own" else None
    return {"k": c.k, "m": c.max_completion, "ready": ready, "timed": timed, "done": done, "ratios": ratios,
            "problems": step_problems(steps, forced), "identical_steps": same, "steps": len(steps["ours"]),
            "ratio": bc.median(ratios), "peak_ratio": done["ours"]["peak_rss_mb"] / done["trl"]["peak_rss_mb"]}


def print_pair(a, res: dict) -> None:
    print(f"\nGRPO step, {a.model_label} ({a.prompts} prompts x K={res['k']}, max {res['m']} new tokens, beta={a.beta}, "
          f"lr={a.lr}), {a.reps} alternating repetitions after {a.warmup} warm-up, torch threads={a.threads}, "
          f"gradient checkpointing {'on' if a.gradient_checkpointing else 'off'}, our log-probs: {a.logprobs}"
          f"{', one packed forward per prompt (ours)' if a.share_prompt else ''}, generators: {_generators(a, res)}\n")
    print("| side | median step (s) | min–max (s) | median rollout (s) | median update (s) | completion tokens/step "
          "| prompt tokens/step | RSS after load (MiB) | peak RSS (MiB) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, label in (("ours", "score-lightning (A)"), ("trl", "TRL GRPOTrainer (B)")):
        rs = res["timed"][name]
        ts = [r["time_s"] for r in rs]
        print(f"| {label} | {bc.median(ts):.3f} | {bc.spread(ts)} | {bc.median([r['rollout_s'] for r in rs]):.3f} "
              f"| {bc.median([r['update_s'] for r in rs]):.3f} | {bc.median([r['completion_tokens'] for r in rs]):.0f} "
              f"| {bc.median([r['prompt_tokens'] for r in rs]):.0f} | {res['ready'][name]['rss_mb']:.0f} "
              f"| {res['done'][name]['peak_rss_mb']:.0f} |")
    print("\nTRL's rollout column is `_generate_and_score_completions` (generation, reward, reference log-probs); "
          "ours is `ScoreModule.rollout` (generation only; the reference forward is in the update).")
    print("per-repetition ratios ours/TRL: " + ", ".join(f"{r:.3f}" for r in res["ratios"]))
    print(f"equal work: settings identical ({', '.join(SETTINGS)}); identical completion ids in "
          f"{res['identical_steps']}/{res['steps']} steps"
          f"{' (not required: each side samples its own tokens)' if a.generator == 'own' else ''}; "
          "token-count differences: "
          + ("none" if not res["problems"] else "\n  " + "\n  ".join(res["problems"])))


def run_scaling(a) -> bool:
    """The K x length table, ours against TRL in every cell; False when any cell failed its equal-work check."""
    rows = []
    print("scaling: ours vs TRL per cell (fresh workers per cell, so peak RSS is per cell and side)", flush=True)
    for k in (2, 4, 8):
        for m in (64, 128, 256):
            res = run_pair(a, k=k, max_completion=m, reps=a.scaling_reps)
            rows.append(res)
            print(f"  K={k} max_len={m}: ratio {res['ratio']:.3f}, peak ratio {res['peak_ratio']:.3f}, "
                  f"token-count differences {len(res['problems'])}; {bc.load_line()}", flush=True)
    print(f"\n{a.prompts} prompts x K completions; medians of {a.scaling_reps} alternating steps after {a.warmup} "
          f"warm-up, per cell; generators: {_generators(a, rows[0], 'the max response')}\n")
    print("| K | max response | completion tokens | ours step (s) | TRL step (s) | ratio | ours peak RSS (MiB) "
          "| TRL peak RSS (MiB) | peak ratio | equal work |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        med = {n: bc.median([x["time_s"] for x in r["timed"][n]]) for n in ("ours", "trl")}
        ok = not r["problems"]
        verdict = "ok" if ok else f"{len(r['problems'])} steps differ"
        print(f"| {r['k']} | {r['m']} | {bc.median([x['completion_tokens'] for x in r['timed']['ours']]):.0f} "
              f"| {med['ours']:.3f} | {med['trl']:.3f} | {r['ratio']:.3f}{'' if ok else ' (refused)'} "
              f"| {r['done']['ours']['peak_rss_mb']:.0f} | {r['done']['trl']['peak_rss_mb']:.0f} "
              f"| {r['peak_ratio']:.3f} | {verdict} |")
    return all(not r["problems"] for r in rows)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=5, help="timed repetitions per side (alternating)")
    p.add_argument("--warmup", type=int, default=1, help="untimed warm-up steps per side")
    p.add_argument("--k", type=int, default=4, help="completions per prompt (K, num_generations)")
    p.add_argument("--prompts", type=int, default=4, help="prompts per step")
    p.add_argument("--max-completion", type=int, default=64, help="max new tokens per completion")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--beta", type=float, default=0.05, help="KL coefficient (both sides run a reference model)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per worker. 1 by default: on a shared machine, OpenMP's spinning threads "
                        "turn other processes' load into 10x step-time swings")
    p.add_argument("--scaling", action="store_true", help="the K x length table, ours vs TRL in every cell")
    p.add_argument("--scaling-reps", type=int, default=3)
    p.add_argument("--logprobs", choices=("fused", "plain", "legacy"), default="fused",
                   help="our side's log-prob path: fused (default, chunked LM head), plain (materialised "
                        "logits) or legacy (the pre-2026-11-30 path), to measure each change in the same conditions")
    p.add_argument("--model", default="tiny",
                   help="tiny (the tests' checkpoint), a model preset (configs/model/NAME.yaml, e.g. smollm2_135m) "
                        "or a checkpoint directory")
    p.add_argument("--gradient-checkpointing", action="store_true",
                   help="both sides recompute each layer in backward (TRL's GRPOConfig default; off by default here)")
    p.add_argument("--share-prompt", action="store_true",
                   help="our side runs each prompt's K rows as one packed row (optim.share_prompt_forward=true): "
                        "the same log-probs and gradients, the prompt computed once")
    p.add_argument("--generator", choices=("identical", "own"), default="identical",
                   help="identical (default): both sides seeded alike, sampling the same tokens with HF generate; "
                        "own: each side its own engine (ours HFEngine, TRL generate), every completion forced to "
                        "--max-completion tokens (EOS and stops masked), token counts checked, tokens not compared")
    p.add_argument("--worker", choices=("ours", "trl"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        return (bw.worker_ours if a.worker == "ours" else bw.worker_trl)(a)
    print(bc.machine_line(), flush=True)
    a.model_label = "tiny Qwen2" if a.model == "tiny" else a.model
    a.model = str(bc.checkpoint(a.model))  # build or convert once here, not concurrently in two workers
    scaling_ok = True
    if a.scaling:
        scaling_ok = run_scaling(a)
        print()
    print(f"before the A/B run: {bc.load_line()}", flush=True)
    res = run_pair(a, verbose=True)
    print_pair(a, res)
    print(f"after: {bc.load_line()}")
    ok = not res["problems"] and scaling_ok
    print(bc.summary_line(ratio_vs_trl=res["ratio"] if ok else None,  # the last line
                          peak_ratio_vs_trl=res["peak_ratio"] if ok else None, equal_work="ok" if ok else "FAILED"))
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
