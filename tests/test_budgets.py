"""Evaluator budgets that fit: the scoring prompt cap, measured with the configured tokenizer, and the
evaluator's context (observations outside its generation budget) against vLLM's max_model_len.

A scoring prompt that overflows raises in ``encode_chat`` mid-run; these checks refuse the config by
name before any model loads instead, and the paper's recipes pass them with Qwen2.5's and Llama-3's
real tokenizers and templates.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from helpers import ROOT, compose, recipe
from score_lightning.launch.budgets import check_budgets, longest_query, measure_scoring, widest_rubric, widest_state
from score_lightning.launch.config_validation import ConfigError, validate_config

TINY = ["tiny_score", "rler_tiny", "given_tiny", "evorubric_tiny", "mams_tiny", "arco_tiny", "grpo_baseline", "rule_tiny",
        "preference_tiny", "drrubric_tiny", "rubricem_tiny"]


@pytest.mark.parametrize("experiment,kind", [("qwen_score", "qwen"), ("qwen_score_1gpu", "qwen"),
                                             ("llama_score", "llama")])
def test_the_paper_recipes_fit_with_their_real_tokenizers(experiment, kind, qwen_ckpt, llama_ckpt):
    from score_lightning.policy.models import load_tokenizer

    ckpt = qwen_ckpt if kind == "qwen" else llama_ckpt
    cfg = compose([*recipe(experiment), f"model.name_or_path={ckpt}"])
    validate_config(cfg)
    b = check_budgets(cfg, load_tokenizer(ckpt))
    assert b.reports == 8 and b.prompt_tokens <= cfg.evaluator.max_prompt_tokens == 8192
    assert 300 < b.overhead_tokens < 1200  # query, widest rubric, every rule, notes, template: measured
    assert b.context_tokens <= cfg.rollout.max_model_len


@pytest.mark.parametrize("experiment", TINY)
def test_the_tiny_experiments_fit(experiment, tiny_ckpt, tokenizer):
    cfg = compose([*recipe(experiment)])
    assert check_budgets(cfg, tokenizer).prompt_tokens <= cfg.evaluator.max_prompt_tokens


def test_too_many_report_tokens_are_refused_by_the_cli_before_any_model_loads(tmp_path):
    t0 = time.time()
    proc = subprocess.run([sys.executable, "src/train.py", *recipe("qwen_score"), "solver.num_rollouts=8",
                           "evaluator.max_report_tokens=1200", f"paths.output_dir={tmp_path}"], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT / "src")), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and time.time() - t0 < 30, proc.stderr[-2000:]
    assert "error:" in proc.stderr and "Traceback" not in proc.stderr
    assert "evaluator.max_prompt_tokens=8192: 8 reports x evaluator.max_report_tokens=1200" in proc.stderr


def test_a_prompt_that_fits_only_without_its_overhead_is_refused_by_measurement(qwen_ckpt, monkeypatch, tmp_path):
    """8 x 1000 < 8192 passes the arithmetic; with ~680 tokens of query, rubric and template it does not fit.
    ``run`` refuses it after loading the tokenizer and before loading any model."""
    import score_lightning.policy.models as models
    from score_lightning.launch.training import run

    cfg = compose([*recipe("qwen_score"), f"model.name_or_path={qwen_ckpt}", "evaluator.max_report_tokens=1000",
                   "retriever=bm25", f"paths.output_dir={tmp_path}"])
    validate_config(cfg)

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the budget check")

    monkeypatch.setattr(models, "load_policy", no_model)
    import score_lightning.launch.training as training

    # the recipe's own inputs (vLLM, a query file of at least 64 queries) are refused earlier on this machine
    # (tests/test_newcomer_refusals.py); the measurement is what this test is about
    monkeypatch.setattr(training, "probe_inputs", lambda cfg: None)
    with pytest.raises(ConfigError) as exc:
        run(cfg)
    msg = str(exc.value)
    assert "evaluator.max_prompt_tokens=8192: the scoring prompt needs up to" in msg
    assert "8 reports x evaluator.max_report_tokens=1000" in msg and "lower evaluator.max_report_tokens" in msg


def test_the_measured_bound_holds_for_real_scoring_prompts(qwen_tokenizer, llama_tokenizer, corpus_file):
    """Prompts built by the step's own scoring_rollouts, over real corpus text cut to max_report_tokens,
    never exceed what check_budgets measured."""
    import json

    from score_lightning.rollout.scripted import ScriptedEngine
    from score_lightning.step.rollouts import rollout_settings, scoring_rollouts

    passages = [json.loads(line)["contents"] for line in open(corpus_file, encoding="utf-8")]
    for tok in (qwen_tokenizer, llama_tokenizer):
        for per_report in (64, 333, 896):
            cfg = compose([*recipe("qwen_score"), f"evaluator.max_report_tokens={per_report}"])
            b = measure_scoring(cfg, tok)
            state = widest_state(cfg)
            reports = [["\n\n".join(passages[40 * k + i * 320: 40 * k + i * 320 + 40]) for k in range(8)]
                       for i in range(3)]
            trajs = scoring_rollouts(ScriptedEngine(tok, lambda req: "</report_evaluations>"), tok, None,
                                     [longest_query(cfg.data, tok)] * 3, reports, [widest_rubric(cfg, state)] * 3, state,
                                     rollout_settings(cfg.solver, cfg.evaluator))
            longest = max(len(t.prompt_ids) for t in trajs)
            assert b.prompt_tokens - 8 * 8 <= longest <= b.prompt_tokens, (per_report, longest, b.prompt_tokens)


def test_pointwise_scoring_sizes_the_prompt_for_one_report(qwen_tokenizer):
    joint = compose([*recipe("qwen_score"), "evaluator.max_report_tokens=2000"])
    with pytest.raises(ConfigError, match="8 reports x evaluator.max_report_tokens=2000"):
        validate_config(joint)
    pointwise = compose([*recipe("qwen_score"), "evaluator.max_report_tokens=2000", "evaluator.scoring=pointwise"])
    validate_config(pointwise)
    b = check_budgets(pointwise, qwen_tokenizer)
    assert b.reports == 1 and 2000 < b.prompt_tokens < 2000 + 1200


def test_vllm_context_must_hold_an_evaluation_with_its_observations(qwen_tokenizer):
    # 8192 prompt + 2048 generated + 10 x 512 observations = 15360 > 12288 (the old recipe's max_model_len)
    with pytest.raises(ConfigError, match="rollout.max_model_len=12288: shorter than an evaluation can grow"):
        validate_config(compose([*recipe("qwen_score"), "rollout.max_model_len=12288"]))
    # the arithmetic passes at 15400, the measured wrappers and the budget notice do not
    cfg = compose([*recipe("qwen_score"), "rollout.max_model_len=15400"])
    validate_config(cfg)
    with pytest.raises(ConfigError, match="rollout.max_model_len=15400: an evaluation can reach 15512 tokens"):
        check_budgets(cfg, qwen_tokenizer)
    with pytest.raises(ConfigError, match="shorter than solver.max_prompt_tokens"):
        validate_config(compose([*recipe("qwen_score"), "solver.max_prompt_tokens=12289"]))
    # an evaluator role on HF (rollout.evaluator_engine=hf) never reaches vLLM's context: only the solver's counts
    on_hf = compose([*recipe("qwen_score"), "rollout.max_model_len=12288", "rollout.evaluator_engine=hf"])
    validate_config(on_hf)
    check_budgets(on_hf, qwen_tokenizer)
    with pytest.raises(ConfigError, match="shorter than solver.max_prompt_tokens"):
        validate_config(compose([*recipe("qwen_score"), "rollout.evaluator_engine=hf", "rollout.max_model_len=9000"]))


def test_given_rubrics_are_measured_from_their_file(tmp_path, tokenizer):
    """rubric=given: the scoring prompt shows the file's criteria, so the longest rubric of the file is measured."""
    import json

    items = [{"text": f"The report states fact number {i} with a citation to a retrieved document", "weight": 1,
              "type": "binary"} for i in range(12)]
    short, long = tmp_path / "short.jsonl", tmp_path / "long.jsonl"
    short.write_text(json.dumps({"id": "q1", "rubrics": items[:2]}) + "\n")
    long.write_text(json.dumps({"id": "q1", "rubrics": items[:2]}) + "\n" + json.dumps({"id": "q2", "rubrics": items})
                    + "\n")
    cfg = compose(["experiment=given_tiny", f"rubric.path={long}"])
    assert len(widest_rubric(cfg, widest_state(cfg)).dims) == 12
    small = measure_scoring(compose(["experiment=given_tiny", f"rubric.path={short}"]), tokenizer)
    assert measure_scoring(cfg, tokenizer).overhead_tokens > small.overhead_tokens + 10 * 10


def test_the_rubric_prompt_with_its_evidence_is_checked_against_the_same_cap(tokenizer, bm25):
    """D_q^0 with titles makes the rubric prompt grow with evaluator.rubric_queries x solver.topk: measured, and
    bounding what the step's own rubric stage builds from real BM25 evidence."""
    from score_lightning.launch.budgets import measure_rubric_prompt
    from score_lightning.harness.scheduler import DimensionScheduler
    from score_lightning.rollout.chat import encode_chat
    from score_lightning.step.rollouts import initial_evidence
    from score_lightning.step.rubric_stage import RubricSampling, rubric_prompt

    cfg = compose(["experiment=tiny_score", "data.batch_size=4"])
    bound = measure_rubric_prompt(cfg, tokenizer)
    assert bound <= cfg.evaluator.max_prompt_tokens
    state = widest_state(cfg)
    queries = [longest_query(cfg.data, tokenizer)] * 4
    evidence, _ = initial_evidence(bm25, queries, int(cfg.solver.topk))
    scheduler = DimensionScheduler(list(state.dimension_pool))
    msgs = rubric_prompt(queries, evidence, state, scheduler, RubricSampling(96, 1.0, 4096, 8))
    assert len(encode_chat(tokenizer, msgs)) <= bound
    many = ["experiment=tiny_score", "data.batch_size=16", "evaluator.rubric_queries=16"]
    with pytest.raises(ConfigError, match=r"the rubric prompt needs up to \d+ tokens \(min\(evaluator.rubric_queries=16"):
        check_budgets(compose(many), tokenizer)
    check_budgets(compose(many + ["evaluator.static_rubric=true"]), tokenizer)  # no rubric prompt is built
