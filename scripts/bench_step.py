"""One GRPO training step: this project's solver phase (A) against TRL's ``GRPOTrainer`` (B), at equal work.

    HF_HUB_OFFLINE=1 python scripts/bench_step.py [--reps 5] [--k 4] [--prompts 4] [--max-completion 64]
                                                  [--scaling] [--profile]

Both sides use the tests' tiny checkpoint and tokenizer, the same ``--prompts`` embedded queries rendered
through the solver chat template (identical token ids, checked), ``K`` completions per prompt,
``max_completion`` new tokens, one optimiser step over the whole batch (no gradient accumulation, one
PPO epoch, so neither side recomputes old log-probs), AdamW at the same lr with constant schedule,
gradient clipping at 1.0, a frozen reference model with KL coefficient 0.05, sampling at temperature
1 with no top-k/top-p, stopping on EOS or ``</answer>``, single-turn with no tools, and the same fixed
reward of the completion text (:func:`bench_common.reward_of_text`).

(A) is the real code path: a ``ScoreModule`` built from the project's Hydra config, fitted by a
``lightning.Trainer``; a bench-only subclass overrides ``training_step`` with the solver phase alone:
``ScoreModule.rollout`` (chat template -> ``run_agent`` -> ``HFEngine``), the fixed reward, then
``ScoreModule.solver_update`` (group advantages, reference log-probs, the GRPO loss, clipping, AdamW).
(B) is ``GRPOTrainer.train()`` with ``use_vllm=False``, ``num_iterations=1`` and ``beta=0.05``.

Each side runs in its own long-lived subprocess (so peak RSS is per side, and torch uses
``--threads`` threads in each). A worker reports each finished step and then blocks, inside the
step-end hook, until the parent's next command, so only one side computes at a time; the parent
alternates A B B A A B ... A step's time runs from the step-begin hook (Lightning's
``on_train_batch_start``, HF's ``on_step_begin``) to the step-end hook (Lightning's
``on_train_batch_end``, HF's ``on_step_end``, after the optimiser step): generation, reward,
reference forward, policy forward/backward, clipping and the optimiser, on both sides. The last line
printed is ``ratio_vs_trl=X``: the median over repetitions of ours/TRL (lower is better).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common as bc  # noqa: E402

SEED = 0


# ====================================================================== workers
def _common_setup(threads: int) -> None:
    import torch

    if threads > 0:
        torch.set_num_threads(threads)


def ours_overrides(a) -> list[str]:
    return [
        "experiment=tiny_score",
        "sft.enabled=false",                        # same starting weights as TRL: no cold start
        "reward.require_citation=false",
        f"solver.num_rollouts={a.k}",
        f"data.batch_size={a.prompts}",
        f"optim.mini_batch_size={a.prompts}",       # one optimiser step per SCORE step
        f"optim.micro_batch_size={a.prompts * a.k}",  # one forward/backward over the whole batch
        "optim.ppo_epochs=1",
        f"optim.lr={a.lr}",
        "optim.warmup_steps=0",
        "optim.weight_decay=0.0",
        "optim.grad_clip=1.0",
        f"loss.kl_coef={a.beta}",
        "loss.entropy_coef=0.0",
        f"solver.max_response_tokens={a.max_completion}",
        "solver.max_tool_calls=0",                  # single turn: only the final (answer) turn, no tools
        "solver.temperature=1.0",
        "solver.top_p=1.0",
        "evaluator.static_rubric=true",             # no rubric generation: the harness fallback rubric
        "evaluator.enabled=false",
        "trainer.enable_progress_bar=false",
        "callbacks.collapse_guard.enabled=false",
        f"seed={SEED}",
    ]


def worker_ours(a) -> None:
    proto = bc.Proto()
    _common_setup(a.threads)
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader

    from score_lightning.module import ScoreModule

    cfg = bc.compose(ours_overrides(a) + [f"paths.output_dir={tempfile.mkdtemp(prefix='bench_ours_')}"])
    from score_lightning.config_validation import validate_config

    validate_config(cfg)
    path = str(bc.tiny_checkpoint())
    queries = bc.bench_queries(a.prompts)
    expected_msgs = bc.solver_chat(queries, cfg)
    n_steps = a.warmup + a.reps

    class NoRetriever:
        """Single-turn, no tools: nothing to retrieve. ``ScoreModule.rollout``'s per-step evidence probe
        (``initial_evidence``, SCORE-specific, no counterpart in TRL) gets empty hits, at no cost."""

        def search(self, queries, topk):
            return [[] for _ in queries]

    class BenchModule(ScoreModule):
        """``training_step`` = the solver phase of a SCORE step, timed; everything else is ScoreModule's."""

        def on_train_start(self) -> None:
            super().on_train_start()
            prompt_ids = [self._chat_ids(m) for m in expected_msgs]
            proto.send("ready", rss_mb=bc.rss_mb(), peak_rss_mb=bc.peak_rss_mb(),
                       prompt_digest=bc.ids_digest(prompt_ids), prompt_lens=[len(p) for p in prompt_ids])
            proto.wait_go()

        def on_train_batch_start(self, batch, batch_idx) -> None:
            self._profiling = a.profile and batch_idx >= a.warmup
            if self._profiling:
                import cProfile

                self._cprof = cProfile.Profile()
                self._tprof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
                self._tprof.__enter__()
                self._cprof.enable()
            self._t0 = time.perf_counter()

        def training_step(self, batch, batch_idx) -> None:
            t0 = time.perf_counter()
            with torch.profiler.record_function("bench/rollout"):
                ro = self.rollout(list(batch["prompt"]))
            t1 = time.perf_counter()
            with torch.profiler.record_function("bench/reward"):
                rewards = torch.tensor([bc.reward_of_text(t.model_text(self.tokenizer)) for t in ro.solver])
            with torch.profiler.record_function("bench/solver_update"):
                metrics = self.solver_update(ro, rewards)
            for sch in self._schedulers():
                sch.step()
            self.score_step += 1
            self._advance_global_step()
            t2 = time.perf_counter()
            self._stats = {
                "rollout_s": t1 - t0, "update_s": t2 - t1,
                "completion_tokens": sum(t.num_model_tokens for t in ro.solver),
                "rows": len(ro.solver), "updates": metrics["solver/updates"],
                "prompt_digest": bc.ids_digest(bc.unique_rows([t.prompt_ids for t in ro.solver])),
            }

        def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
            dt = time.perf_counter() - self._t0
            extra = {}
            if self._profiling:
                self._cprof.disable()
                self._tprof.__exit__(None, None, None)
                extra["profile"] = _profile_text(self._cprof, self._tprof, a.profile_top)
            proto.send("step", time_s=dt, peak_rss_mb=bc.peak_rss_mb(), rss_mb=bc.rss_mb(), **self._stats, **extra)
            proto.wait_go()  # idle until the parent's next command: no loop work overlaps the other side's step

    if a.legacy_logprobs:
        _use_legacy_logprobs()
    module = BenchModule(cfg, path)
    module.retriever = NoRetriever()
    batches = [{"prompt": list(queries)} for _ in range(n_steps)]
    loader = DataLoader(batches, batch_size=None, shuffle=False, num_workers=0)
    pl.seed_everything(SEED, workers=True)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, precision="32-true", max_steps=n_steps, max_epochs=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        limit_val_batches=0, use_distributed_sampler=False, default_root_dir=cfg.paths.output_dir,
    )
    trainer.fit(module, train_dataloaders=loader)
    proto.send("done", peak_rss_mb=bc.peak_rss_mb(), score_step=module.score_step)


def _use_legacy_logprobs() -> None:
    """Swap in the pre-2026-11-30 ``policy_logprobs`` (logits for every position, row slices), for before/after."""
    import torch

    import score_lightning.module as mod
    from score_lightning.losses import entropy_from_logits, token_logprobs

    def legacy(model, batch, temperature=1.0, with_entropy=False, entropy_grad=False):
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
        logits = out.logits[:, :-1, :].float()
        if temperature != 1.0:
            logits = logits / temperature
        logp = token_logprobs(logits, batch.input_ids[:, 1:])
        ent = None
        if with_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                ent = entropy_from_logits(logits)
        return logp, ent

    mod.policy_logprobs = legacy


def _profile_text(cprof, tprof, top: int) -> str:
    import io
    import pstats

    buf = io.StringIO()
    buf.write("### torch.profiler: top ops by self CPU time (incl. bench/* ranges)\n")
    buf.write(tprof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top, max_name_column_width=60))
    buf.write("\n### torch.profiler: bench ranges (total CPU time)\n")
    for ev in sorted(tprof.key_averages(), key=lambda e: -e.cpu_time_total):
        if ev.key.startswith("bench/"):
            buf.write(f"{ev.key:28s} {ev.cpu_time_total / 1e6:8.3f} s\n")
    buf.write("\n### cProfile: top functions by cumulative time\n")
    st = pstats.Stats(cprof, stream=buf)
    st.sort_stats("cumulative").print_stats(top)
    buf.write("\n### cProfile: top functions by own time\n")
    st.sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def worker_trl(a) -> None:
    proto = bc.Proto()
    _common_setup(a.threads)
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from score_lightning import protocol as P
    from score_lightning.models import load_tokenizer

    cfg = bc.compose(ours_overrides(a) + ["paths.output_dir=/tmp/unused"])
    path = str(bc.tiny_checkpoint())
    queries = bc.bench_queries(a.prompts)
    msgs = bc.solver_chat(queries, cfg)
    n_steps = a.warmup + a.reps
    tok = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    # stop on EOS or </answer>, like the project's solver turn (TRL ends completions at every eos id)
    model.generation_config.eos_token_id = [tok.eos_token_id, tok.convert_tokens_to_ids(P.ANSWER_CLOSE)]
    # each step takes the same `prompts` prompts in order (no shuffling), K generations each
    ds = Dataset.from_dict({"prompt": [m for _ in range(n_steps) for m in msgs]})

    def reward_fn(completions, **kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [bc.reward_of_text(t) for t in texts]

    out_dir = tempfile.mkdtemp(prefix="bench_trl_")
    args = GRPOConfig(
        output_dir=out_dir, per_device_train_batch_size=a.prompts * a.k, num_generations=a.k,
        gradient_accumulation_steps=1, max_completion_length=a.max_completion, learning_rate=a.lr,
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999,
        max_grad_norm=1.0, beta=a.beta, num_iterations=1, epsilon=0.2, loss_type="dapo", scale_rewards="group",
        temperature=1.0, top_p=1.0, top_k=0, use_vllm=False, use_cpu=True, bf16=False, fp16=False,
        report_to=[], logging_strategy="no", save_strategy="no", eval_strategy="no", disable_tqdm=True,
        log_completions=False, shuffle_dataset=False, max_steps=n_steps, seed=SEED, dataloader_num_workers=0,
    )
    state = {"gen_s": 0.0, "tokens": 0}

    class Timer(TrainerCallback):
        def on_train_begin(self, args_, st, control, **kw):
            prompt_ids = [list(tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True,
                                                       return_dict=True)["input_ids"]) for m in msgs]
            proto.send("ready", rss_mb=bc.rss_mb(), peak_rss_mb=bc.peak_rss_mb(),
                       prompt_digest=bc.ids_digest(prompt_ids), prompt_lens=[len(p) for p in prompt_ids])
            proto.wait_go()

        def on_step_begin(self, args_, st, control, **kw):
            state.update(gen_s=0.0, tokens=0)
            self.t0 = time.perf_counter()

        def on_step_end(self, args_, st, control, **kw):
            dt = time.perf_counter() - self.t0
            proto.send("step", time_s=dt, peak_rss_mb=bc.peak_rss_mb(), rss_mb=bc.rss_mb(), rollout_s=state["gen_s"],
                       update_s=dt - state["gen_s"], completion_tokens=state["tokens"], rows=a.prompts * a.k,
                       prompt_digest=state.get("digest"))
            proto.wait_go()

    trainer = GRPOTrainer(model=model, reward_funcs=[reward_fn], args=args, train_dataset=ds, processing_class=tok,
                          callbacks=[Timer()])
    gen = trainer._generate_and_score_completions

    def timed_generate(inputs):
        t = time.perf_counter()
        out = gen(inputs)
        state["gen_s"] += time.perf_counter() - t
        state["tokens"] += int(out["completion_mask"].sum())
        ids, mask = out["prompt_ids"], out["prompt_mask"]
        rows = [[x for x, keep in zip(r, m) if keep] for r, m in zip(ids.tolist(), mask.tolist())]
        state["digest"] = bc.ids_digest(bc.unique_rows(rows))
        return out

    trainer._generate_and_score_completions = timed_generate
    trainer.train()
    proto.send("done", peak_rss_mb=bc.peak_rss_mb(), global_step=trainer.state.global_step)


# ====================================================================== parent
def _worker_argv(side: str, a, **over) -> list[str]:
    v = vars(a) | over
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", side]
    for key in ("reps", "warmup", "k", "prompts", "max_completion", "lr", "beta", "threads", "profile_top"):
        argv += [f"--{key.replace('_', '-')}", str(v[key])]
    for flag in ("profile", "legacy_logprobs"):
        if v.get(flag):
            argv.append(f"--{flag.replace('_', '-')}")
    return argv


def _env() -> dict:
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("PYTHONWARNINGS", "ignore")
    return env


def run_pair(a) -> float:
    bc.tiny_checkpoint()  # build once here, not concurrently in two workers
    workers = {"ours": bc.Worker(_worker_argv("ours", a, profile=False), "ours", _env()),
               "trl": bc.Worker(_worker_argv("trl", a, profile=False), "trl", _env())}
    try:
        ready = {name: w.expect("ready") for name, w in workers.items()}
        if ready["ours"]["prompt_digest"] != ready["trl"]["prompt_digest"]:
            raise RuntimeError(f"prompt token ids differ: {ready}")
        steps: dict[str, list[dict]] = {"ours": [], "trl": []}
        print(f"prompt lengths (tokens): {ready['ours']['prompt_lens']} (identical on both sides)", flush=True)
        for i in range(a.warmup + a.reps):
            for name in ("ours", "trl") if i % 2 == 0 else ("trl", "ours"):  # ABBA: no side always goes first
                r = workers[name].step()
                r["rep"] = i - a.warmup
                steps[name].append(r)
                tag = "warm-up" if i < a.warmup else f"rep {i - a.warmup + 1}/{a.reps}"
                print(f"  {tag:10s} {name:4s} {r['time_s']:7.3f} s  (rollout {r['rollout_s']:.3f} s, "
                      f"{r['completion_tokens']} completion tokens, peak RSS {r['peak_rss_mb']:.0f} MiB)", flush=True)
        done = {name: w.finish() for name, w in workers.items()}
    finally:
        for w in workers.values():
            w.kill()
    for name, rs in steps.items():
        digests = {r["prompt_digest"] for r in rs}
        if digests != {ready[name]["prompt_digest"]}:
            raise RuntimeError(f"{name}: the step's prompt ids differ from the checked ones: {digests}")
    timed = {n: [r for r in rs if r["rep"] >= 0] for n, rs in steps.items()}
    ratios = [o["time_s"] / t["time_s"] for o, t in zip(timed["ours"], timed["trl"])]
    ratio = bc.median(ratios)
    print()
    print(f"GRPO step, tiny Qwen2 ({a.prompts} prompts x K={a.k}, max {a.max_completion} new tokens, beta={a.beta}, "
          f"lr={a.lr}), {a.reps} alternating repetitions after {a.warmup} warm-up, "
          f"torch threads={a.threads or 'default'}"
          + (" [ours: --legacy-logprobs]" if a.legacy_logprobs else ""))
    print()
    print("| side | median step (s) | min–max (s) | median rollout (s) | median update (s) | completion tokens/step "
          "| RSS after load (MiB) | peak RSS (MiB) |")
    print("|---|---|---|---|---|---|---|---|")
    labels = {"ours": "score-lightning (A)", "trl": "TRL GRPOTrainer (B)"}
    for name in ("ours", "trl"):
        rs = timed[name]
        ts = [r["time_s"] for r in rs]
        print(f"| {labels[name]} | {bc.median(ts):.3f} | {min(ts):.3f}–{max(ts):.3f} "
              f"| {bc.median([r['rollout_s'] for r in rs]):.3f} | {bc.median([r['update_s'] for r in rs]):.3f} "
              f"| {bc.median([r['completion_tokens'] for r in rs]):.0f} | {ready[name]['rss_mb']:.0f} "
              f"| {done[name]['peak_rss_mb']:.0f} |")
    print()
    print("TRL's rollout column is `_generate_and_score_completions` (generation, reward, reference log-probs); "
          "ours is `ScoreModule.rollout` (generation only; the reference forward is in the update).")
    print("per-repetition ratios ours/TRL: " + ", ".join(f"{r:.3f}" for r in ratios))
    return ratio


def run_scaling(a) -> None:
    bc.tiny_checkpoint()
    rows = []
    print("scaling of this project's step (one subprocess per cell, so peak RSS is per cell)", flush=True)
    for k in (2, 4, 8):
        for m in (64, 128, 256):
            w = bc.Worker(_worker_argv("ours", a, k=k, max_completion=m, reps=a.scaling_reps, profile=False),
                          f"ours-k{k}-m{m}", _env())
            try:
                ready = w.expect("ready")
                rs = [w.step() for _ in range(a.warmup + a.scaling_reps)][a.warmup:]
                done = w.finish()
            finally:
                w.kill()
            row = dict(k=k, m=m, step=bc.median([r["time_s"] for r in rs]),
                       rollout=bc.median([r["rollout_s"] for r in rs]), update=bc.median([r["update_s"] for r in rs]),
                       tokens=bc.median([r["completion_tokens"] for r in rs]), rss0=ready["rss_mb"],
                       peak=done["peak_rss_mb"])
            rows.append(row)
            print(f"  K={k} max_len={m}: step {row['step']:.3f} s (rollout {row['rollout']:.3f}, update "
                  f"{row['update']:.3f}), peak RSS {row['peak']:.0f} MiB", flush=True)
    print()
    print(f"{a.prompts} prompts x K completions; median of {a.scaling_reps} steps after {a.warmup} warm-up")
    print()
    print("| K | max response | rows | completion tokens | step (s) | rollout (s) | update (s) | rollout share "
          "| RSS after load (MiB) | peak RSS (MiB) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['k']} | {r['m']} | {a.prompts * r['k']} | {r['tokens']:.0f} | {r['step']:.3f} "
              f"| {r['rollout']:.3f} "
              f"| {r['update']:.3f} | {100 * r['rollout'] / r['step']:.0f}% | {r['rss0']:.0f} | {r['peak']:.0f} |")


def run_profile(a) -> None:
    bc.tiny_checkpoint()
    w = bc.Worker(_worker_argv("ours", a, reps=1, profile=True), "ours-profile", _env())
    try:
        w.expect("ready")
        rs = [w.step() for _ in range(a.warmup + 1)]
        w.finish()
    finally:
        w.kill()
    r = rs[-1]
    print(f"profiled step: {r['time_s']:.3f} s (rollout {r['rollout_s']:.3f} s, update {r['update_s']:.3f} s; "
          f"profiler overhead included)")
    print(r["profile"])


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
                   help="torch threads per worker (0: torch's default). 1 by default: on a shared machine, "
                        "OpenMP's spinning threads turn other processes' load into 10x step-time swings")
    p.add_argument("--scaling", action="store_true", help="K x length table of this project's step")
    p.add_argument("--scaling-reps", type=int, default=3)
    p.add_argument("--profile", action="store_true", help="torch.profiler + cProfile of this project's step")
    p.add_argument("--profile-top", type=int, default=20)
    p.add_argument("--legacy-logprobs", action="store_true",
                   help="our side uses the pre-optimisation policy_logprobs (every position through the LM head, "
                        "per-row slices), to measure the speed-up in the same conditions")
    p.add_argument("--worker", choices=("ours", "trl"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker == "ours":
        return worker_ours(a)
    if a.worker == "trl":
        return worker_trl(a)
    print(bc.machine_line(), flush=True)
    if a.profile:
        run_profile(a)
        print()
    if a.scaling:
        run_scaling(a)
        print()
    print(f"load average before the A/B run: {os.getloadavg()[0]:.2f}", flush=True)
    ratio = run_pair(a)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print(f"ratio_vs_trl={ratio:.3f}")  # the last line


if __name__ == "__main__":
    main()
