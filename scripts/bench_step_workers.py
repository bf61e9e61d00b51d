"""The two sides of ``bench_step.py``, each run in its own subprocess: this project (A) and TRL (B).

Each worker reports ``ready`` (with its prompt token ids' digest and its equal-work settings), then
one ``step`` record per GRPO step, blocking inside the step-end hook until the parent's next command.
A step record carries its time, the completion and prompt token counts, a digest of the completion
ids and the peak RSS, so the parent can check equal work step by step.

Generation, ``--generator identical`` (the default): before each step's generation both sides seed
torch with the same per-step seed. Both sample with HF ``generate``'s sampling (temperature 1, no
top-k/top-p) on the same left-padded prompts, so with equal weights they draw the same tokens, and
the per-step token counts are equal by construction rather than by luck (the weights stay equal up
to float rounding, which rarely flips a sample).

``--generator own``: neither side is seeded per step, and each generates its own way: ours through
the trainer's ``HFEngine`` (``rollout=hf``: the in-place KV cache, each distinct prompt prefilled once
for its K rows) with ``ignore_eos=True``, TRL through its ``unwrapped_model.generate`` with
``min_new_tokens`` in its ``generation_kwargs``. EOS and both stop ids are masked out of sampling on
both sides, so every completion has exactly ``max_completion`` tokens; each worker reports that
forced length in ``ready`` (ours: the engine's flag, TRL: its ``GenerationConfig``).
"""

from __future__ import annotations

import tempfile
import time

import bench_common as bc

SEED = 0


def generation_seed(step: int) -> int:
    """The torch seed set right before step ``step``'s generation, on both sides."""
    return 10_000 + SEED + step


def ours_overrides(a) -> list[str]:
    """The project's config for the GRPO cell: the solver phase only, one optimiser step over the batch."""
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
        f"optim.share_prompt_forward={str(bool(a.share_prompt)).lower()}",
        f"model.name_or_path={a.model}",           # the checkpoint both sides load (bench_step.py --model)
        f"model.gradient_checkpointing={str(bool(a.gradient_checkpointing)).lower()}",
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


def _step_tokens(prompts: list[list[int]], completions: list[list[int]]) -> dict:
    """Per-step equal-work evidence: token counts and digests of the prompt and completion ids."""
    return {"prompt_tokens": sum(map(len, prompts)), "completion_tokens": sum(map(len, completions)),
            "prompt_digest": bc.ids_digest(bc.unique_rows(prompts)), "completion_digest": bc.ids_digest(completions)}


def _kept(ids, mask) -> list[list[int]]:
    """Each row's ids where the mask is 1 (TRL's padded prompt / completion tensors -> token lists)."""
    return [[x for x, keep in zip(r, m) if keep] for r, m in zip(ids.tolist(), mask.tolist())]


def use_logprobs(kind: str) -> None:
    """Our side's log-prob path: ``fused`` (the default), ``plain`` (materialised logits) or ``legacy``
    (the pre-2026-11-30 path: every position through the LM head, per-row slices)."""
    import functools

    import torch

    import score_lightning.step.solver_update as su
    from score_lightning.step.batching import policy_logprobs
    from score_lightning.step.losses import entropy_from_logits, token_logprobs

    if kind == "fused":
        return

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

    su.policy_logprobs = legacy if kind == "legacy" else functools.partial(policy_logprobs, fused=False)


def worker_ours(a) -> None:
    proto = bc.Proto()
    bc.set_threads(a.threads)
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader

    from score_lightning.launch.config_validation import validate_config
    from score_lightning.module import ScoreModule
    from score_lightning.rollout.chat import encode_chat
    from score_lightning.step.solver_update import solver_update

    cfg = bc.compose(ours_overrides(a) + [f"paths.output_dir={tempfile.mkdtemp(prefix='bench_ours_')}"])
    validate_config(cfg)
    malloc = bc.set_malloc(cfg)
    path = a.model
    queries = bc.bench_queries(a.prompts)
    expected_msgs = bc.solver_chat(queries, cfg)
    n_steps = a.warmup + a.reps
    use_logprobs(a.logprobs)

    class NoRetriever:
        """Single-turn, no tools: nothing to retrieve. ``ScoreModule.rollout``'s per-step evidence probe
        (``initial_evidence``, SCORE-specific, no counterpart in TRL) gets empty hits, at no cost."""

        def search(self, queries, topk):
            return [[] for _ in queries]

    class BenchModule(ScoreModule):
        """``training_step`` = the solver phase of a SCORE step, timed; everything else is ScoreModule's."""

        def on_train_start(self) -> None:
            super().on_train_start()
            prompt_ids = [encode_chat(self.tokenizer, m) for m in expected_msgs]
            stops = sorted({self.tokenizer.eos_token_id, self.tokenizer.convert_tokens_to_ids("</answer>")})
            if a.generator == "own":  # every completion runs to max_completion (EOS and stops masked)
                from score_lightning.rollout.hf_engine import HFEngine

                assert isinstance(self.engine, HFEngine), type(self.engine)
                self.engine.ignore_eos = True
            proto.send("ready", rss_mb=bc.rss_mb(), peak_rss_mb=bc.peak_rss_mb(),
                       prompt_digest=bc.ids_digest(prompt_ids), prompt_lens=[len(p) for p in prompt_ids],
                       gradient_checkpointing=bool(self.policy.is_gradient_checkpointing), stop_ids=stops,
                       dtype=str(next(self.policy.parameters()).dtype), threads=torch.get_num_threads(), malloc=malloc,
                       forced_length=a.max_completion if self.engine.ignore_eos else 0,
                       generator=type(self.engine).__name__)
            proto.wait_go()

        def on_train_batch_start(self, batch, batch_idx) -> None:
            self._t0 = time.perf_counter()

        def training_step(self, batch, batch_idx) -> None:
            if a.generator == "identical":
                torch.manual_seed(generation_seed(batch_idx))
            t0 = time.perf_counter()
            ro = self.rollout(list(batch["prompt"]))
            t1 = time.perf_counter()
            rewards = torch.tensor([bc.reward_of_ids(self.tokenizer, t.response_ids) for t in ro.solver])
            upd = solver_update(self.policy, self.ref, ro.solver, rewards, self.solver_objective.settings,
                                self.tokenizer.pad_token_id, self.optimizer_hooks("solver", self.policy))
            for sch in self.lr_scheduler_list():
                sch.step()
            self.score_step += 1
            self.advance_global_step()
            self._stats = {"rollout_s": t1 - t0, "update_s": time.perf_counter() - t1, "rows": len(ro.solver),
                           "updates": upd.updates,
                           **_step_tokens([t.prompt_ids for t in ro.solver], [t.response_ids for t in ro.solver])}

        def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
            dt = time.perf_counter() - self._t0
            proto.send("step", time_s=dt, peak_rss_mb=bc.peak_rss_mb(), rss_mb=bc.rss_mb(), **self._stats)
            proto.wait_go()  # idle until the parent's next command: no loop work overlaps the other side's step

    module = BenchModule(cfg, path)
    module.retriever = NoRetriever()
    loader = DataLoader([{"prompt": list(queries)} for _ in range(n_steps)], batch_size=None, shuffle=False)
    pl.seed_everything(SEED, workers=True)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, precision="32-true", max_steps=n_steps, max_epochs=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        limit_val_batches=0, use_distributed_sampler=False, default_root_dir=cfg.paths.output_dir,
    )
    trainer.fit(module, train_dataloaders=loader)
    proto.send("done", peak_rss_mb=bc.peak_rss_mb(), score_step=module.score_step)


def worker_trl(a) -> None:
    proto = bc.Proto()
    bc.set_threads(a.threads)
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from score_lightning import protocol as P
    from score_lightning.policy.models import load_tokenizer

    cfg = bc.compose(ours_overrides(a) + ["paths.output_dir=/tmp/unused"])
    malloc = bc.set_malloc(cfg)  # the same process-level allocator setting as ours
    path = a.model
    msgs = bc.solver_chat(bc.bench_queries(a.prompts), cfg)
    n_steps = a.warmup + a.reps
    tok = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    stops = sorted({tok.eos_token_id, tok.convert_tokens_to_ids(P.ANSWER_CLOSE)})
    # TRL's completion mask ends at its `eos_token_ids` (read from the model's generation config) and its
    # generate() call uses `generation_kwargs`: both must hold our two stop ids
    model.generation_config.eos_token_id = list(stops)
    own = a.generator == "own"
    ds = Dataset.from_dict({"prompt": [m for _ in range(n_steps) for m in msgs]})  # same prompts each step, in order

    def reward_fn(completions, completion_ids, **kwargs):
        return [bc.reward_of_ids(tok, ids) for ids in completion_ids]

    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench_trl_"), per_device_train_batch_size=a.prompts * a.k,
        num_generations=a.k, gradient_accumulation_steps=1, max_completion_length=a.max_completion,
        learning_rate=a.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, adam_beta1=0.9,
        adam_beta2=0.999, max_grad_norm=1.0, beta=a.beta, num_iterations=1, epsilon=0.2, loss_type="dapo",
        scale_rewards="group", temperature=1.0, top_p=1.0, top_k=0, use_vllm=False, use_cpu=True, bf16=False,
        fp16=False, gradient_checkpointing=bool(a.gradient_checkpointing),
        gradient_checkpointing_kwargs={"use_reentrant": False},  # what ours uses (models.load_policy)
        generation_kwargs={"eos_token_id": list(stops)} | ({"min_new_tokens": a.max_completion} if own else {}),
        mask_truncated_completions=False,  # TRL's default, stated: forced-length completions all train
        report_to=[], logging_strategy="no", save_strategy="no", eval_strategy="no", disable_tqdm=True,
        log_completions=False, shuffle_dataset=False, max_steps=n_steps, seed=SEED, dataloader_num_workers=0,
    )
    state: dict = {"gen_s": 0.0, "step": 0}

    class Timer(TrainerCallback):
        def on_train_begin(self, args_, st, control, model=None, **kw):
            prompt_ids = [list(tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True,
                                                       return_dict=True)["input_ids"]) for m in msgs]
            proto.send("ready", rss_mb=bc.rss_mb(), peak_rss_mb=bc.peak_rss_mb(),
                       prompt_digest=bc.ids_digest(prompt_ids), prompt_lens=[len(p) for p in prompt_ids],
                       gradient_checkpointing=bool(model.is_gradient_checkpointing),
                       stop_ids=sorted(set(trainer.eos_token_ids)),
                       generation_stop_ids=sorted(set(trainer.generation_config.eos_token_id)),
                       dtype=str(next(model.parameters()).dtype), threads=torch.get_num_threads(), malloc=malloc,
                       forced_length=int(trainer.generation_config.min_new_tokens or 0), generator="generate")
            proto.wait_go()

        def on_step_begin(self, args_, st, control, **kw):
            state["gen_s"] = 0.0
            self.t0 = time.perf_counter()

        def on_step_end(self, args_, st, control, **kw):
            dt = time.perf_counter() - self.t0
            proto.send("step", time_s=dt, peak_rss_mb=bc.peak_rss_mb(), rss_mb=bc.rss_mb(), rollout_s=state["gen_s"],
                       update_s=dt - state["gen_s"], rows=a.prompts * a.k, **state["tokens"])
            state["step"] += 1
            proto.wait_go()

    trainer = GRPOTrainer(model=model, reward_funcs=[reward_fn], args=args, train_dataset=ds, processing_class=tok,
                          callbacks=[Timer()])
    gen = trainer._generate_and_score_completions

    def timed_generate(inputs):
        if not own:
            torch.manual_seed(generation_seed(state["step"]))
        t = time.perf_counter()
        out = gen(inputs)
        state["gen_s"] += time.perf_counter() - t
        state["tokens"] = _step_tokens(_kept(out["prompt_ids"], out["prompt_mask"]),
                                       _kept(out["completion_ids"], out["completion_mask"]))
        return out

    trainer._generate_and_score_completions = timed_generate
    trainer.train()
    proto.send("done", peak_rss_mb=bc.peak_rss_mb(), global_step=trainer.state.global_step)
