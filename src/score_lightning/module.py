"""``ScoreModule``: one SCORE step per ``training_step``, with manual optimisation.

Step t: rubric (evaluator) -> K solver rollouts per query -> scoring (evaluator, may search) ->
rewards -> Phase 1 solver GRPO -> consistency + EMA -> Phase 2 evaluator REINFORCE (every U) ->
scheduler stats -> logging. ``score_step`` counts SCORE steps, and Lightning's ``global_step`` is
kept equal to it (see :meth:`_advance_global_step`), so ``trainer.max_steps``, checkpoint
intervals, the harness period and the TensorBoard x-axis all count SCORE steps.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist
from lightning.pytorch import LightningModule
from omegaconf import DictConfig, OmegaConf

from score_lightning import protocol as P
from score_lightning.batching import TokenBatch, build_token_batch, policy_logprobs
from score_lightning.harness.scheduler import DimensionScheduler
from score_lightning.harness.state import HarnessState
from score_lightning.losses import group_advantages, grpo_token_loss, k3_kl, masked_mean, reinforce_loss
from score_lightning.rewards.functions import (
    EMABaseline, apply_verifier, citation_validity, group_consistency, solver_reward,
)
from score_lightning.roles.answer import extract_conclusion, parse_answer
from score_lightning.roles.evaluation import parse_evaluation
from score_lightning.roles.prompts import rubric_messages, scoring_messages, solver_messages
from score_lightning.roles.rubric import Rubric, fallback_rubric, parse_rubric, rubric_token_span
from score_lightning.retrieval.base import RetrievalError
from score_lightning.rollout.agent import AgentConfig, TagStops, run_agent
from score_lightning.rollout.engine import SamplingParams
from score_lightning.rollout.trajectory import Trajectory

log = logging.getLogger(__name__)


class TrainingHalted(RuntimeError):
    """The run cannot continue safely (repeated non-finite updates, retrieval outage); a checkpoint was saved."""


@dataclass
class StepRollouts:
    """Everything one SCORE step generated, kept together for the updates and for logging."""

    queries: list[str]
    rubric: Rubric
    rubric_valid: bool
    rubric_error: str
    rubric_traj: Trajectory | None
    solver: list[Trajectory]
    scoring: list[Trajectory]
    extras: dict = field(default_factory=dict)


class ScoreModule(LightningModule):
    """The SCORE trainer. ``cfg`` is the full Hydra config (validated before construction)."""

    def __init__(self, cfg: DictConfig | dict, model_path: str, tokenizer_path: str | None = None):
        super().__init__()
        self.automatic_optimization = False
        cfg = OmegaConf.create(cfg) if isinstance(cfg, dict) else cfg
        self.save_hyperparameters({"cfg": OmegaConf.to_container(cfg, resolve=True), "model_path": model_path,
                                   "tokenizer_path": tokenizer_path or model_path})
        self.cfg = cfg
        self.model_path = model_path
        from score_lightning.models import load_tokenizer

        self.tokenizer = load_tokenizer(tokenizer_path or model_path)
        self.K = int(cfg.solver.num_rollouts)
        self.score_step = 0
        self.data_cursor = 0
        init = OmegaConf.to_container(cfg.harness.initial_state, resolve=True)
        self.harness_state = HarnessState.from_dict(init)
        self.scheduler = DimensionScheduler(list(self.harness_state.dimension_pool))
        self.baseline = EMABaseline(float(cfg.evaluator.ema_beta))
        self.skipped_steps = 0
        self.consecutive_skips = 0
        self.retrieval_errors_total = 0
        self.consecutive_retrieval_outages = 0
        self._max_consecutive_skips = 0
        self._recent: deque[dict[str, float]] = deque(maxlen=max(1, int(cfg.harness.every_n_steps)))
        self._pending_rng: dict | None = None
        self.policy = None
        self.evaluator_policy = None
        self.ref = None
        self.engine = None            # set in setup() (HF) or by the vLLM callback
        self.evaluator_engine = None
        self.retriever = None
        #: test hook: called with (module, phase) before each optimiser step; may poison gradients
        self.pre_step_hook: Callable[["ScoreModule", str], None] | None = None
        self.last_rollouts: StepRollouts | None = None

    # ------------------------------------------------------------------ building
    def configure_model(self) -> None:
        if self.policy is not None:
            return
        from score_lightning.models import load_policy

        m = self.cfg.model
        self.policy = load_policy(self.model_path, m.dtype, m.gradient_checkpointing)
        if float(self.cfg.loss.kl_coef) > 0:
            self.ref = load_policy(self.model_path, m.dtype).eval().requires_grad_(False)
        if not self.cfg.actor.shared:
            self.evaluator_policy = load_policy(self.model_path, m.dtype, m.gradient_checkpointing)
        if self.cfg.strategy.name == "fsdp":
            from score_lightning.fsdp import shard_models

            shard_models(self, self.cfg.strategy)

    @property
    def eval_model(self):
        return self.policy if self.evaluator_policy is None else self.evaluator_policy

    def setup(self, stage: str) -> None:
        from score_lightning.retrieval.from_config import retriever_from_config
        from score_lightning.rollout.hf_engine import HFEngine

        if self.retriever is None:
            self.retriever = retriever_from_config(self.cfg.retriever, self.cfg.paths.cache_dir)
        if self.engine is None and self.cfg.rollout.engine == "hf":
            tok = self.tokenizer
            bs = int(self.cfg.rollout.max_batch_size)
            self.engine = HFEngine(lambda: self.policy, tok.pad_token_id, tok.eos_token_id, tok, bs)
            self.evaluator_engine = HFEngine(lambda: self.eval_model, tok.pad_token_id, tok.eos_token_id, tok, bs)

    def configure_optimizers(self):
        o = self.cfg.optim

        def make(params):
            opt = torch.optim.AdamW(params, lr=float(o.lr), betas=tuple(o.betas), weight_decay=float(o.weight_decay))
            warm, ratio = int(o.warmup_steps), float(o.warmup_start_ratio)
            fn = lambda s: 1.0 if warm <= 0 or s >= warm else ratio + (1.0 - ratio) * s / warm  # noqa: E731
            return opt, torch.optim.lr_scheduler.LambdaLR(opt, fn)

        opt, sch = make([p for p in self.policy.parameters() if p.requires_grad])
        if self.evaluator_policy is None:
            return [opt], [sch]
        opt_e, sch_e = make([p for p in self.evaluator_policy.parameters() if p.requires_grad])
        return [opt, opt_e], [sch, sch_e]

    # ------------------------------------------------------------------ prompts
    def _chat_ids(self, messages: list[dict]) -> list[int]:
        enc = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = enc["input_ids"] if isinstance(enc, dict) or hasattr(enc, "keys") else enc
        limit = int(self.cfg.solver.max_prompt_tokens)
        if len(ids) > limit:
            raise ValueError(
                f"a prompt has {len(ids)} tokens > solver.max_prompt_tokens={limit}; raise it or shorten the query"
            )
        return list(ids)

    def _truncate_text(self, text: str, max_tokens: int) -> str:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return text if len(ids) <= max_tokens else self.tokenizer.decode(ids[:max_tokens])

    # ------------------------------------------------------------------ rollouts
    def sample_rubric(self, queries: list[str]) -> tuple[Rubric, bool, str, Trajectory | None]:
        state = self.harness_state
        if self.cfg.evaluator.static_rubric:
            return fallback_rubric(state), True, "", None
        msgs = rubric_messages(queries, state, self.scheduler.required(), self.scheduler.avoided(), self.scheduler.explore())
        prompt = self._chat_ids(msgs)
        stops = TagStops(self.tokenizer, [P.DIMENSIONS_CLOSE])
        params = SamplingParams(int(self.cfg.evaluator.max_rubric_tokens), float(self.cfg.evaluator.temperature),
                                stop_token_ids=stops.token_ids, stop_strings=stops.strings)
        gen = self.evaluator_engine.generate([prompt], params)[0]
        traj = Trajectory(prompt_ids=prompt)
        traj.append(gen.token_ids, 1, gen.logprobs)
        traj.truncated = gen.finish_reason == "length"
        parsed = parse_rubric(self.tokenizer.decode(gen.token_ids), state)
        if parsed.valid and parsed.rubric is not None:
            return parsed.rubric, True, "", traj
        return fallback_rubric(state), False, parsed.error, traj

    def initial_evidence(self, queries: list[str]) -> tuple[list[list[str]], int]:
        """D_q^0 = R(q): the retriever's top passages for each query (ids), and the failure count.

        It grounds the environment of each query (METHOD: E_q = Harness(q, D_q^0, S)), appears in
        the text samples, and doubles as a per-step retrieval health probe that does not depend on
        whether the policy chose to search.
        """
        try:
            hits = self.retriever.search(list(queries), int(self.cfg.solver.topk))
            return [[h.id for h in row] for row in hits], 0
        except RetrievalError as exc:
            log.warning("initial retrieval failed at SCORE step %d: %s", self.score_step, exc)
            return [[] for _ in queries], 1

    def rollout(self, queries: list[str]) -> StepRollouts:
        c = self.cfg
        evidence, evidence_errors = self.initial_evidence(queries)
        rubric, valid, err, rubric_traj = self.sample_rubric(queries)
        solver_cfg = AgentConfig(
            max_tool_calls=int(c.solver.max_tool_calls), max_response_tokens=int(c.solver.max_response_tokens),
            max_observation_tokens=int(c.solver.max_observation_tokens), topk=int(c.solver.topk),
            temperature=float(c.solver.temperature), top_p=float(c.solver.top_p), finish_tag=P.ANSWER_CLOSE,
        )
        prompts, metas = [], []
        for qi, q in enumerate(queries):
            ids = self._chat_ids(solver_messages(q, rubric, self.harness_state, int(c.solver.max_tool_calls)))
            for k in range(self.K):
                prompts.append(ids)
                metas.append({"query_index": qi, "k": k})
        solver = run_agent(self.engine, self.tokenizer, prompts, self.retriever, solver_cfg, metas)
        return StepRollouts(queries, rubric, valid, err, rubric_traj, solver, scoring=[],
                            extras={"evidence": evidence, "evidence_errors": evidence_errors})

    def score_reports(self, ro: StepRollouts, answers: list) -> None:
        c = self.cfg
        eval_cfg = AgentConfig(
            max_tool_calls=int(c.evaluator.max_tool_calls), max_response_tokens=int(c.evaluator.max_response_tokens),
            max_observation_tokens=int(c.solver.max_observation_tokens), topk=int(c.solver.topk),
            temperature=float(c.evaluator.temperature), finish_tag=P.EVALS_CLOSE,
            allow_search=int(c.evaluator.max_tool_calls) > 0,
        )
        prompts = []
        for qi, q in enumerate(ro.queries):
            reports = []
            for k in range(self.K):
                a = answers[qi * self.K + k]
                text = a.answer if a.answer else "(no report)"
                reports.append(self._truncate_text(text, int(c.evaluator.max_report_tokens)))
            prompts.append(self._chat_ids(scoring_messages(q, reports, ro.rubric, self.harness_state)))
        ro.scoring = run_agent(self.evaluator_engine, self.tokenizer, prompts, self.retriever, eval_cfg)

    # ------------------------------------------------------------------ rewards
    def compute_rewards(self, ro: StepRollouts) -> dict[str, Any]:
        c, K, tok = self.cfg, self.K, self.tokenizer
        answers = [
            parse_answer(t.model_text(tok), t.truncated, require_citation=bool(c.reward.require_citation),
                         min_chars=int(c.reward.min_answer_chars))
            for t in ro.solver
        ]
        self.score_reports(ro, answers)
        pc = self.harness_state.process_constraints
        score_rows, depth, eval_valid = [], [], []
        for qi, st in enumerate(ro.scoring):
            ev = parse_evaluation(st.model_text(tok), ro.rubric, K, require_verification=pc.require_verification,
                                  require_gap_analysis=pc.require_gap_analysis)
            eval_valid.append(float(ev.valid))
            score_rows.extend(ev.score_matrix(ro.rubric, K))
            depth.extend([len(st.search_queries)] * K)
        scores = torch.tensor(score_rows, dtype=torch.float32)
        depth_t = torch.tensor(depth, dtype=torch.long)
        scores, verified = apply_verifier(scores, depth_t, int(c.verifier.min_search_depth), bool(c.verifier.enabled))
        validity = torch.tensor([float(a.valid) for a in answers])
        weights = torch.tensor(ro.rubric.weights, dtype=torch.float32).expand(len(answers), -1)
        rewards = solver_reward(validity, scores, weights)
        conclusions = [extract_conclusion(a.answer) if a.valid and a.answer else "" for a in answers]
        groups = [conclusions[i * K:(i + 1) * K] for i in range(len(ro.queries))]
        per_query, r_eval = group_consistency(groups)
        cites = [citation_validity(a.cited_ids, t.retrieved_ids) for a, t in zip(answers, ro.solver)]
        cites = [v for v in cites if v is not None]
        return {
            "answers": answers, "rewards": rewards, "validity": validity, "verified": verified.float(),
            "scores": scores, "consistency_per_query": per_query, "consistency": float(r_eval),
            "eval_valid_rate": float(np.mean(eval_valid)) if eval_valid else 0.0,
            "citation_validity": float(np.mean(cites)) if cites else float("nan"),
            "depth": depth_t.float(),
        }

    # ------------------------------------------------------------------ updates
    def _world(self) -> tuple[int, bool]:
        ws = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        return ws, ws > 1

    def _global_sum(self, value: float) -> float:
        ws, multi = self._world()
        if not multi:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return float(t.item())

    def _gather_objects(self, obj: Any) -> list:
        ws, multi = self._world()
        if not multi:
            return [obj]
        out = [None] * ws
        dist.all_gather_object(out, obj)
        return out

    def _optimizer_step(self, opt_index: int, params: list[torch.nn.Parameter], phase: str) -> tuple[float, bool]:
        """Clip, check finiteness and step. Returns (grad_norm, stepped)."""
        opts = self.optimizers()
        opt = opts[opt_index] if isinstance(opts, (list, tuple)) else opts
        if self.pre_step_hook is not None:
            self.pre_step_hook(self, phase)
        if phase == "solver" and self.score_step in set(self.cfg.get("debug", {}).get("nan_grad_steps", []) or []):
            for p in params:  # fault injection (debug.nan_grad_steps): poison this update's gradients
                if p.grad is not None:
                    p.grad.fill_(float("nan"))
        max_norm = float(self.cfg.optim.grad_clip)
        grads = [p for p in params if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(grads, max_norm if max_norm > 0 else float("inf"), foreach=None)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        norm = float(norm)
        if not math.isfinite(norm):
            opt.zero_grad(set_to_none=True)
            self.skipped_steps += 1
            self.consecutive_skips += 1
            log.warning("non-finite gradient norm in %s update at SCORE step %d: update skipped", phase, self.score_step)
            return norm, False
        # The raw torch optimiser: Lightning's wrapper would advance global_step per call (see module doc).
        opt.optimizer.step() if hasattr(opt, "optimizer") else opt.step()
        opt.zero_grad(set_to_none=True)
        self.consecutive_skips = 0
        return norm, True

    def solver_update(self, ro: StepRollouts, rewards: torch.Tensor) -> dict[str, float]:
        c, o = self.cfg, self.cfg.optim
        trajs = ro.solver
        adv = group_advantages(rewards, self.K, normalize_std=bool(c.loss.norm_adv_by_std), eps=float(c.loss.adv_eps))
        batch = build_token_batch([t.prompt_ids for t in trajs], [t.response_ids for t in trajs],
                                  [t.response_mask for t in trajs], self.tokenizer.pad_token_id)
        n = len(trajs)
        temp = float(c.solver.temperature)
        micro = int(o.micro_batch_size)
        mini_rows = int(o.mini_batch_size) * self.K
        multi_mb = int(o.ppo_epochs) > 1 or mini_rows < n
        kl_coef = float(c.loss.kl_coef)
        old_lp = ref_lp = None
        with torch.no_grad():
            if multi_mb:  # off-policy after the first mini-batch: old log-probs from the trainer model
                old_lp = self._chunked_logprobs(self.policy, batch, temp, micro)
            if kl_coef > 0 and self.ref is not None:
                ref_lp = self._chunked_logprobs(self.ref, batch, temp, micro)
            if c.rollout.engine != "hf":
                # engine vs trainer logprobs under the same (pre-update) weights: rollout/logprob_diff
                from score_lightning.callbacks.vllm_rollout import logprob_mismatch

                trainer_lp = old_lp if old_lp is not None else self._chunked_logprobs(self.policy, batch, temp, micro)
                self.last_logprob_diff = logprob_mismatch(trajs, trainer_lp)
        sums = {"pg": 0.0, "kl": 0.0, "clipfrac": 0.0, "entropy": 0.0, "tokens": 0.0, "loss": 0.0}
        norms, stepped = [], 0
        ws, _ = self._world()
        params = [p for p in self.policy.parameters() if p.requires_grad]
        for _epoch in range(int(o.ppo_epochs)):
            for start in range(0, n, mini_rows):
                rows = list(range(start, min(n, start + mini_rows)))
                mb_tokens = self._global_sum(float(batch.rows(rows).num_tokens))
                if mb_tokens == 0:
                    continue
                for ms in range(0, len(rows), micro):
                    idx = rows[ms:ms + micro]
                    sub = batch.rows(idx).to(self.device)
                    width = sub.loss_mask.shape[1]
                    logp, ent = policy_logprobs(self.policy, sub, temp, with_entropy=True,
                                                entropy_grad=float(c.loss.entropy_coef) > 0)
                    old = old_lp[idx, :width].to(self.device) if old_lp is not None else logp.detach()
                    ref = ref_lp[idx, :width].to(self.device) if ref_lp is not None else None
                    loss_sum, st = grpo_token_loss(
                        logp, old, ref, adv[idx].to(self.device), sub.loss_mask,
                        clip_low=float(c.loss.clip_ratio_low), clip_high=float(c.loss.clip_ratio_high),
                        kl_coef=kl_coef, entropy_coef=float(c.loss.entropy_coef), entropy=ent,
                    )
                    # exact global token mean: DDP/FSDP average gradients over ranks, hence * world size
                    self.manual_backward(loss_sum * (ws / mb_tokens))
                    for key in ("pg", "kl", "clipfrac", "entropy", "tokens"):
                        sums[key] += float(st[key])
                    sums["loss"] += float(loss_sum.detach())
                norm, ok = self._optimizer_step(0, params, "solver")
                norms.append(norm)
                stepped += int(ok)
        t = max(sums["tokens"], 1.0)
        return {
            "solver/loss": sums["loss"] / t, "solver/pg_loss": sums["pg"] / t, "solver/kl": sums["kl"] / t,
            "solver/clipfrac": sums["clipfrac"] / t, "solver/entropy": sums["entropy"] / t,
            "solver/grad_norm": float(np.mean(norms)) if norms else 0.0, "solver/updates": float(stepped),
            "solver/advantage_abs_mean": float(adv.abs().mean()),
        }

    def _chunked_logprobs(self, model, batch: TokenBatch, temp: float, micro: int) -> torch.Tensor:
        out = torch.zeros_like(batch.loss_mask)
        for s in range(0, batch.input_ids.shape[0], micro):
            idx = list(range(s, min(s + micro, batch.input_ids.shape[0])))
            sub = batch.rows(idx).to(self.device)
            lp, _ = policy_logprobs(model, sub, temp)
            out[idx, : lp.shape[1]] = lp.float().cpu()
        return out

    def evaluator_update(self, ro: StepRollouts, advantage: float) -> dict[str, float]:
        """REINFORCE on the rubric tokens: -alpha * A * log pi(rubric | rubric prompt) + KL."""
        traj = ro.rubric_traj
        span = rubric_token_span(traj.response_ids, self.tokenizer.convert_tokens_to_ids(P.DIMENSIONS_CLOSE))
        if span is None:  # no closing tag: train the whole sampled rubric response
            span = (0, len(traj.response_ids))
        mask = [1 if span[0] <= j < span[1] else 0 for j in range(len(traj.response_ids))]
        batch = build_token_batch([traj.prompt_ids], [traj.response_ids], [mask], self.tokenizer.pad_token_id).to(self.device)
        model = self.eval_model
        temp = float(self.cfg.evaluator.temperature)
        logp, _ = policy_logprobs(model, batch, temp)
        seq_lp = (logp * batch.loss_mask).sum(dim=1)
        loss = reinforce_loss(seq_lp, advantage, float(self.cfg.evaluator.alpha))
        kl_val = 0.0
        kl_coef = float(self.cfg.loss.kl_coef)
        if kl_coef > 0 and self.ref is not None:
            with torch.no_grad():
                ref_lp, _ = policy_logprobs(self.ref, batch, temp)
            kl = masked_mean(k3_kl(logp, ref_lp, kl_clamp=float(self.cfg.loss.kl_clamp)), batch.loss_mask)
            loss = loss + kl_coef * kl
            kl_val = float(kl.detach())
        self.manual_backward(loss)
        params = [p for p in model.parameters() if p.requires_grad]
        norm, ok = self._optimizer_step(0 if self.evaluator_policy is None else 1, params, "evaluator")
        return {"evaluator/loss": float(loss.detach()), "evaluator/kl": kl_val, "evaluator/grad_norm": norm,
                "evaluator/rubric_logprob": float(seq_lp.detach().sum()), "evaluator/updated": float(ok)}

    # ------------------------------------------------------------------ the step
    def training_step(self, batch: dict, batch_idx: int) -> None:
        c = self.cfg
        queries = list(batch["prompt"])
        self.data_cursor = int(batch.get("cursor", self.data_cursor + 1))
        t0 = time.perf_counter()
        ro = self.rollout(queries)
        t1 = time.perf_counter()
        rw = self.compute_rewards(ro)
        t2 = time.perf_counter()
        metrics: dict[str, float] = {}
        rewards = rw["rewards"]
        metrics.update(self._degenerate_cases(ro, rw))
        if not bool(c.solver.freeze):
            metrics.update(self.solver_update(ro, rewards))
        # consistency reward and EMA-centred advantage for the evaluator. Each data-parallel rank
        # samples its own rubric (one evaluator rollout per rank); the baseline and the scheduler
        # see every rank's results in rank order, so their state is identical on all ranks.
        eval_reward = rw["consistency"] if ro.rubric_valid else float(c.evaluator.invalid_rubric_reward)
        shared = self._gather_objects((eval_reward, rw["consistency"], list(ro.rubric.dims), rw["consistency_per_query"]))
        r_eval = float(np.mean([g[1] for g in shared]))
        b_prev = self.baseline.value
        _, base = self.baseline.update(float(np.mean([g[0] for g in shared])))
        advantage = eval_reward - b_prev
        do_eval = (bool(c.evaluator.enabled) and not bool(c.evaluator.static_rubric) and ro.rubric_traj is not None
                   and (self.score_step + 1) % int(c.evaluator.update_every) == 0)
        if do_eval:
            metrics.update(self.evaluator_update(ro, advantage))
        t3 = time.perf_counter()
        for _, _, dims, per_query in shared:
            self.scheduler.update_stats(dims, per_query)
        for sch in self._schedulers():
            sch.step()
        self._count_faults(ro, metrics)
        metrics.update(self._step_metrics(ro, rw, r_eval, advantage, base, t1 - t0, t2 - t1, t3 - t2))
        self.last_rollouts = ro
        self.score_step += 1
        self._advance_global_step()
        self._log_metrics(metrics)
        self._maybe_halt(metrics)
        log.info("SCORE step %d done: reward=%.3f valid=%.2f rubric_valid=%d consistency=%.3f tool_calls=%.2f (%.1fs)",
                 self.score_step, metrics["solver/reward_mean"], metrics["solver/answer_valid_rate"],
                 int(ro.rubric_valid), r_eval, metrics["rollout/tool_calls_mean"], time.perf_counter() - t0)
        if int(c.logging.text_every_n_steps) > 0 and (self.score_step % int(c.logging.text_every_n_steps) == 1
                                                      or int(c.logging.text_every_n_steps) == 1):
            self._log_text(ro, rw)

    def _degenerate_cases(self, ro: StepRollouts, rw: dict) -> dict[str, float]:
        """The explicit paths for bad model output; each is logged, none is an error.

        - no valid rubric: the solver was conditioned on the harness fallback rubric
          (``evaluator/fallback_rubric``), and the evaluator is rewarded ``invalid_rubric_reward``;
        - a group with no valid report: every reward in it is 0, so its advantages are exactly 0
          (``solver/no_valid_report_group_rate``);
        - a group whose rewards are all equal: zero advantages, no policy gradient from it
          (``solver/zero_advantage_group_rate``); the KL and entropy terms still apply.
        """
        K, n = self.K, len(ro.queries)
        rewards, validity = rw["rewards"].view(n, K), rw["validity"].view(n, K)
        no_valid = (validity.sum(dim=1) == 0).float()
        equal = (rewards.max(dim=1).values == rewards.min(dim=1).values).float()
        if not ro.rubric_valid:
            log.info("SCORE step %d: invalid rubric (%s): solver used the fallback rubric", self.score_step, ro.rubric_error)
        if bool(equal.all()):
            log.info("SCORE step %d: all rewards equal within every group: zero advantages", self.score_step)
        return {
            "evaluator/fallback_rubric": float(not ro.rubric_valid),
            "solver/no_valid_report_group_rate": float(no_valid.mean()),
            "solver/zero_advantage_group_rate": float(equal.mean()),
        }

    def _schedulers(self) -> list:
        s = self.lr_schedulers()
        if s is None:
            return []
        return list(s) if isinstance(s, (list, tuple)) else [s]

    def _advance_global_step(self) -> None:
        """Make Lightning's ``global_step`` count SCORE steps.

        Under manual optimisation ``global_step`` is the number of ``LightningOptimizer.step`` calls;
        a SCORE step makes zero (frozen solver, skipped update) to many (PPO mini-batches, evaluator)
        raw optimiser calls, so the progress counter is advanced here exactly once per step.
        """
        progress = self.trainer.fit_loop.epoch_loop.manual_optimization.optim_step_progress
        progress.increment_ready()
        progress.increment_completed()

    def _count_faults(self, ro: StepRollouts, metrics: dict) -> None:
        """Retrieval and numeric fault counters, summed over ranks so every rank decides alike."""
        searches = sum(t.tool_calls - t.invalid_actions for t in ro.solver + ro.scoring) + len(ro.queries)
        errors = sum(t.retrieval_errors for t in ro.solver + ro.scoring) + len(ro.queries) * ro.extras.get("evidence_errors", 0)
        per_rank = self._gather_objects((searches, errors, self.consecutive_skips))
        searches, errors = sum(g[0] for g in per_rank), sum(g[1] for g in per_rank)
        self._max_consecutive_skips = max(g[2] for g in per_rank)
        self.retrieval_errors_total += errors
        metrics["rollout/retrieval_errors_step"] = float(errors)
        self.consecutive_retrieval_outages = self.consecutive_retrieval_outages + 1 if errors >= searches > 0 else 0

    def _maybe_halt(self, metrics: dict[str, float]) -> None:
        """Stop (with a checkpoint) instead of training on garbage: repeated NaNs or a dead retriever."""
        limit = int(self.cfg.optim.max_consecutive_skips)
        if self._max_consecutive_skips > limit:
            self._halt(metrics, f"{self._max_consecutive_skips} consecutive non-finite updates (optim.max_consecutive_skips={limit})")
        limit_r = int(self.cfg.retriever.max_failed_steps)
        if self.consecutive_retrieval_outages >= limit_r:
            self._halt(metrics, f"every retrieval failed in {self.consecutive_retrieval_outages} consecutive steps "
                       f"(retriever.max_failed_steps={limit_r}); check {self.cfg.retriever.get('url') or 'the retriever'}")

    def _halt(self, metrics: dict[str, float], reason: str) -> None:
        """Write ``last.ckpt`` for the finished step (atomic) and stop with :class:`TrainingHalted`."""
        if self.logger is not None and self.global_rank == 0:
            # self.log() would only flush after training_step returns, which it will not
            clean = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
            self.logger.log_metrics(clean, step=self.score_step - 1)
            self.logger.save()
        path = Path(self.cfg.callbacks.model_checkpoint.dirpath) / "last.ckpt"
        self.trainer.save_checkpoint(str(path))
        log.error("training stopped: %s; checkpoint saved to %s", reason, path)
        raise TrainingHalted(f"training stopped: {reason}; checkpoint saved to {path}")

    def _step_metrics(self, ro, rw, r_eval, advantage, base, t_roll, t_score, t_update) -> dict[str, float]:
        solver = ro.solver
        gen_tokens = sum(t.num_model_tokens for t in solver + ro.scoring) + (
            ro.rubric_traj.num_model_tokens if ro.rubric_traj else 0)
        rewards = rw["rewards"]
        m = {
            "solver/reward_mean": float(rewards.mean()),
            "solver/reward_std": float(rewards.std(unbiased=False)),
            "solver/answer_valid_rate": float(rw["validity"].mean()),
            "solver/citation_validity": rw["citation_validity"],
            "solver/skipped_steps": float(self.skipped_steps),
            "evaluator/consistency": r_eval,
            "evaluator/baseline": base,
            "evaluator/advantage": advantage,
            "evaluator/rubric_valid_rate": float(ro.rubric_valid),
            "evaluator/verified_rate": float(rw["verified"].mean()),
            "evaluator/scoring_valid_rate": rw["eval_valid_rate"],
            "evaluator/verification_depth_mean": float(rw["depth"].mean()) if len(rw["depth"]) else 0.0,
            "harness/version": float(self.harness_state.version),
            "rollout/tool_calls_mean": float(np.mean([t.tool_calls for t in solver])),
            "rollout/response_len_mean": float(np.mean([len(t.response_ids) for t in solver])),
            "rollout/truncated_rate": float(np.mean([t.truncated for t in solver])),
            "rollout/invalid_actions": float(sum(t.invalid_actions for t in solver)),
            "rollout/retrieval_errors": float(self.retrieval_errors_total),
            "time/rollout_s": t_roll,
            "time/scoring_s": t_score,
            "time/update_s": t_update,
            "time/weight_sync_s": float(getattr(self, "last_weight_sync_s", 0.0)),
            "throughput/tokens_per_s": gen_tokens / max(t_roll + t_score, 1e-9),
            "solver/lr": float(self._schedulers()[0].get_last_lr()[0]) if self._schedulers() else float(self.cfg.optim.lr),
        }
        if torch.cuda.is_available():
            m["memory/peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30
        lp_diff = self._logprob_mismatch(solver)
        if lp_diff is not None:
            m["rollout/logprob_diff"] = lp_diff
        for name, freq in self.scheduler.frequencies().items():
            m[f"dims/{name}_freq"] = float(freq)
        self._recent.append({
            "verified_rate": m["evaluator/verified_rate"], "rubric_valid_rate": m["evaluator/rubric_valid_rate"],
            "consistency": r_eval, "reward_mean": m["solver/reward_mean"], "reward_std": m["solver/reward_std"],
            "answer_valid_rate": m["solver/answer_valid_rate"], "tool_calls_mean": m["rollout/tool_calls_mean"],
        })
        return m

    def _logprob_mismatch(self, trajs: list[Trajectory]) -> float | None:
        """Mean |engine - trainer| logprob over sampled tokens (set in ``solver_update`` for non-HF engines)."""
        return getattr(self, "last_logprob_diff", None)

    def _log_metrics(self, metrics: dict[str, float]) -> None:
        clean = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
        # logger=True uses global_step, which equals score_step (see _advance_global_step)
        self.log_dict(clean, on_step=True, on_epoch=False, prog_bar=False, logger=True, batch_size=1, sync_dist=False)
        self.log("score_step", float(self.score_step), prog_bar=True, logger=False, batch_size=1)
        self.log("reward", clean.get("solver/reward_mean", 0.0), prog_bar=True, logger=False, batch_size=1)

    def _log_text(self, ro: StepRollouts, rw: dict) -> None:
        exp = getattr(self.logger, "experiment", None) if self.logger else None
        if exp is None or not hasattr(exp, "add_text") or self.global_rank != 0:
            return
        tok = self.tokenizer
        t = ro.solver[0]
        ev = ro.scoring[0].model_text(tok) if ro.scoring else ""
        sample = (
            f"**query**: {ro.queries[0]}\n\n**rubric** (valid={ro.rubric_valid} {ro.rubric_error}): "
            f"`{ro.rubric.to_xml()}`\n\n**report**:\n```\n{t.response_text(tok)}\n```\n\n"
            f"**reward**: {float(rw['rewards'][0]):.3f}\n\n**evaluation**:\n```\n{ev}\n```"
        )
        exp.add_text("samples/trajectory", sample, self.score_step)
        if ro.rubric_traj is not None:
            exp.add_text("samples/rubric", "```\n" + ro.rubric_traj.response_text(tok) + "\n```", self.score_step)
        exp.add_text("harness/state_snapshot", "```json\n" + self.harness_state.to_json(include_pool=False) + "\n```",
                     self.score_step)

    # ------------------------------------------------------------------ harness interface
    def harness_stats(self) -> dict[str, float]:
        """Means over the last M steps, plus dimension frequencies: what the meta-harness reacts to."""
        stats: dict[str, float] = {}
        if self._recent:
            for key in self._recent[0]:
                stats[key] = float(np.mean([r[key] for r in self._recent]))
        for name, f in self.scheduler.frequencies().items():
            stats[f"dims/{name}_freq"] = float(f)
        return stats

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["score"] = {
            "score_step": self.score_step,
            "data_cursor": self.data_cursor,
            "baseline": self.baseline.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "harness_state": self.harness_state.to_dict(),
            "skipped_steps": self.skipped_steps,
            "retrieval_errors_total": self.retrieval_errors_total,
            "recent": list(self._recent),
            "rng": _rng_state(),
            # every rank's RNG (dump_checkpoint runs on all ranks; rank 0 writes the file)
            "rng_per_rank": self._gather_objects(_rng_state()),
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        s = checkpoint.get("score")
        if s is None:
            raise ValueError("checkpoint has no 'score' section: not a score-lightning checkpoint")
        self.score_step = int(s["score_step"])
        self.data_cursor = int(s["data_cursor"])
        self.baseline.load_state_dict(s["baseline"])
        self.scheduler.load_state_dict(s["scheduler"])
        self.harness_state = HarnessState.from_dict(s["harness_state"])
        self.skipped_steps = int(s["skipped_steps"])
        self.retrieval_errors_total = int(s.get("retrieval_errors_total", 0))
        self._recent.clear()
        self._recent.extend(s.get("recent", []))
        per_rank = s.get("rng_per_rank") or [s["rng"]]
        self._pending_rng = per_rank[self.global_rank] if self.global_rank < len(per_rank) else s["rng"]
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if dm is not None and hasattr(dm, "set_start_cursor"):
            dm.set_start_cursor(self.data_cursor)

    def on_train_start(self) -> None:
        # RNG is restored last, after setup consumed whatever it needed, so sampling resumes exactly.
        if self._pending_rng is not None:
            _set_rng_state(self._pending_rng)
            self._pending_rng = None
        elif self.global_rank > 0:
            # decorrelate sampling across data-parallel ranks; rank 0 keeps the single-process stream
            seed = int(self.cfg.seed) + 1_000_003 * self.global_rank
            torch.manual_seed(seed)
            np.random.seed(seed % 2**32)
            random.seed(seed)

    # ------------------------------------------------------------------ export
    def export_policy(self, out_dir: str | Path) -> Path:
        """``save_pretrained`` of the policy (safetensors) plus tokenizer; collective under FSDP."""
        from score_lightning.fsdp import full_state_dict

        out = Path(out_dir)
        state = full_state_dict(self.policy)
        if self.global_rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            model = self.policy
            model.save_pretrained(out, state_dict=state, safe_serialization=True)
            self.tokenizer.save_pretrained(out)
        return out


def _rng_state() -> dict:
    """RNG states as tensors and plain types, so checkpoints load with ``weights_only=True``."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_py = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "python": {"version": version, "internal": list(internal), "gauss": gauss_py},
    }


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss"]))
