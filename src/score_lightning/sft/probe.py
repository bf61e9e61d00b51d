"""The cold-start probe: how often the fine-tuned policy's first RL samples already parse.

Run after SFT (when ``sft.probe`` asks for it); its rates go into the checkpoint's metadata and
TensorBoard, to tell a cold start that taught the format from one that did not before RL starts.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from score_lightning import protocol as P
from score_lightning.data.queries import load_queries
from score_lightning.harness.scheduler import DimensionScheduler
from score_lightning.harness.state import HarnessState
from score_lightning.rewards.citations import cites_only_retrieved
from score_lightning.roles.evidence import evidence_from_hits
from score_lightning.roles.prompts import rubric_messages
from score_lightning.roles.rubric import fallback_rubric, parse_rubric
from score_lightning.rollout.agent import TagStops
from score_lightning.rollout.engine import SamplingParams
from score_lightning.rollout.hf_engine import HFEngine
from score_lightning.rollout.chat import encode_chat
from score_lightning.sft.demo_types import demo_budgets
from score_lightning.step.evaluations import group_evaluations
from score_lightning.step.reward_assembly import parse_answers
from score_lightning.step.rollouts import rollout_settings, scoring_rollouts, solver_rollouts


def probe_policy(model, tokenizer, retriever, cfg: DictConfig, n_rubric: int, n_solver: int, seed: int = 0,
                 n_scoring: int | None = None) -> dict[str, float]:
    """Sample from ``model`` exactly as a first RL step would and report validity rates.

    Rubrics: the harness's initial state with the scheduler's first-step hints, at the evaluator
    temperature. Solver: the step's solver stage (``solver_rollouts``: its workflow, ``HFEngine``, the
    retriever) at the solver temperature. Scoring: the solver answers, K per prompt, parsed as RL parses them.
    """
    b = demo_budgets(cfg.solver, cfg.evaluator)
    rng = random.Random(seed)
    queries = [q.prompt for q in load_queries(cfg.data.queries_path, cfg.data.split)]
    state = HarnessState.from_dict(OmegaConf.to_container(cfg.harness.initial_state, resolve=True))
    sched = DimensionScheduler(list(state.dimension_pool))
    engine = HFEngine(lambda: model, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer,
                      int(cfg.rollout.max_batch_size))
    out: dict[str, float] = {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if n_rubric > 0:
            nq = int(cfg.data.batch_size)
            sampled = [rng.sample(queries, nq) for _ in range(n_rubric)]
            prompts = [encode_chat(tokenizer, rubric_messages(qs, state, sched.required(), sched.avoided(), sched.explore(),
                                                            evidence=evidence_from_hits(retriever.search(qs, b.topk))))
                       for qs in sampled]
            stops = TagStops(tokenizer, [P.DIMENSIONS_CLOSE])
            gens = engine.generate(prompts, SamplingParams(b.max_rubric_tokens, float(cfg.evaluator.temperature),
                                                           stop_token_ids=stops.token_ids, stop_strings=stops.strings))
            tol = cfg.evaluator.rubric_weight_sum_tol
            parses = [parse_rubric(tokenizer.decode(g.token_ids), state, tol) for g in gens]
            out["probe/rubric_valid_rate"] = float(np.mean([p.valid for p in parses]))
            out["probe/rubric_parsed_rate"] = float(np.mean([p.rubric is not None for p in parses]))
            out["probe/rubric_len_mean"] = float(np.mean([len(g.token_ids) for g in gens]))
            errors: dict[str, int] = {}
            for p in parses:
                if not p.valid:
                    errors[p.error.split("'")[0].strip()] = errors.get(p.error.split("'")[0].strip(), 0) + 1
            out["probe/rubric_errors"] = errors  # type: ignore[assignment]
        if n_solver > 0:
            K = b.num_rollouts
            rubric = fallback_rubric(state)
            n_groups = max(1, math.ceil(n_solver / K))
            group_queries = [rng.choice(queries) for _ in range(n_groups)]
            # the step's own solver stage, so a workflow policy (solver.agent=mams, rubricem) is probed as it will
            # roll out, not as a ReAct loop it was never taught
            trajs = solver_rollouts(engine, tokenizer, retriever, group_queries, [rubric] * n_groups, state,
                                    rollout_settings(cfg.solver, cfg.evaluator))
            answers = parse_answers(trajs, tokenizer, cfg.reward)  # a(r) as RL judges it
            out["probe/answer_valid_rate"] = float(np.mean([a.valid for a in answers]))
            out["probe/cited_rate"] = float(np.mean([bool(a.cited_ids) for a in answers]))
            # per citing report, all or nothing (the step's solver/citation_validity is the share of cited ids)
            cite_ok = [float(cites_only_retrieved(a.cited_ids, t.retrieved_ids)) for a, t in zip(answers, trajs)
                       if a.cited_ids]
            out["probe/cites_only_retrieved_rate"] = float(np.mean(cite_ok)) if cite_ok else 0.0
            out["probe/tool_calls_mean"] = float(np.mean([t.tool_calls for t in trajs]))
            out["probe/invalid_actions_mean"] = float(np.mean([t.invalid_actions for t in trajs]))
            out["probe/truncated_rate"] = float(np.mean([t.truncated for t in trajs]))
            out["probe/response_len_mean"] = float(np.mean([len(t.response_ids) for t in trajs]))
            n_sc = n_groups if n_scoring is None else min(n_scoring, n_groups)
            if n_sc > 0:
                eval_cfg = b.scoring_agent()
                eval_cfg = type(eval_cfg)(**{**eval_cfg.__dict__, "temperature": float(cfg.evaluator.temperature)})
                # the step's own scoring stage (prompts, report cuts, constrained scoring), at this probe's budgets
                settings = replace(rollout_settings(cfg.solver, cfg.evaluator), scoring=eval_cfg)
                reports = [[a.answer if a.answer else None for a in answers[g * K:(g + 1) * K]] for g in range(n_sc)]
                sources = [[t.retrieved_ids for t in trajs[g * K:(g + 1) * K]] for g in range(n_sc)]
                strajs = scoring_rollouts(engine, tokenizer, retriever, group_queries[:n_sc], reports, [rubric] * n_sc,
                                          state, settings, sources)
                evs = group_evaluations(strajs, [rubric] * n_sc, K, settings.scoring_protocol, state.process_constraints,
                                        tokenizer, settings.score_readout)
                out["probe/scoring_valid_rate"] = float(np.mean([v for e in evs for v in e.evaluations_valid]))
                out["probe/scoring_reports_parsed"] = float(np.mean([len(e.parse.reports) / K for e in evs]))
                out["probe/scoring_tool_calls_mean"] = float(np.mean([len(t.search_queries) for t in strajs]))
                out["probe/scoring_truncated_rate"] = float(np.mean([t.truncated for t in strajs]))
    return out
