"""Constrained scoring (``evaluator.constrained_scoring``): the grammar accepts exactly what the parser calls
valid, a random model held to it writes parseable evaluations, and the packaged cold start scores every
report at the first RL step of ``tiny_score`` (seed 1)."""

from __future__ import annotations

import os
import subprocess
import sys

import llguidance
import pytest
import torch

from helpers import ROOT, read_scalars
from score_lightning.roles.evaluation import parse_evaluation
from score_lightning.roles.rubric import Rubric
from score_lightning.rollout.constrained import ScoringConstraint, ll_tokenizer, text_added_tokens
from score_lightning.rollout.engine import SamplingParams
from score_lightning.rollout.hf_engine import HFEngine

DIMS = ("factual_support", "citation_grounding")
RUBRIC = Rubric(DIMS, (0.6, 0.4))

VALID = ('<report_evaluations><report id="1"><verification>[json.dumps] found by search.</verification>'
         '<gap_analysis>Misses json.loads.</gap_analysis><scores><score dim="factual_support" value="7" reason="good"/>'
         '<score dim="citation_grounding" value="10"/></scores></report>\n<report id="2"><scores>'
         '<score dim="factual_support" value="0" reason="missing"/><score dim="citation_grounding" value="3"/>'
         '</scores></report></report_evaluations>')
INVALID = {
    "a dimension the rubric does not have": VALID.replace('dim="citation_grounding" value="10"', 'dim="insight" value="10"'),
    "a value above 10": VALID.replace('value="10"', 'value="11"'),
    "a missing report": VALID.split("\n")[0] + "</report_evaluations>",
    "dimensions out of order": VALID.replace('<score dim="factual_support" value="7" reason="good"/>'
                                             '<score dim="citation_grounding" value="10"/>',
                                             '<score dim="citation_grounding" value="10"/>'
                                             '<score dim="factual_support" value="7" reason="good"/>'),
}


def _accepts(tok, grammar: str, text: str) -> bool:
    m = llguidance.LLMatcher(ll_tokenizer(tok, len(tok), [tok.eos_token_id]),
                             llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    for t in tok(text, add_special_tokens=False)["input_ids"]:
        m.consume_token(t)
        if m.is_error():
            return False
    return m.is_accepting()


@pytest.mark.parametrize("which", ["tokenizer", "qwen_tokenizer"])
def test_grammar_accepts_what_the_parser_calls_valid(which, request):
    tok = request.getfixturevalue(which)  # tiny: tags are added tokens; Qwen2.5: tags are plain BPE text
    c = ScoringConstraint(DIMS, 2, added_tokens=text_added_tokens(tok))
    assert parse_evaluation(VALID, RUBRIC, 2).valid
    assert _accepts(tok, c.turn_grammar(True), VALID) and _accepts(tok, c.turn_grammar(False), VALID)
    assert _accepts(tok, c.turn_grammar(True), "<think>Check.</think><search>json dumps</search>")
    assert not _accepts(tok, c.turn_grammar(False), "<search>json dumps</search>")  # the budget is spent: finish only
    for why, text in INVALID.items():
        assert not _accepts(tok, c.turn_grammar(True), text), why
    # the process rules: a required section must be there and non-empty
    strict = ScoringConstraint(DIMS, 2, require_verification=True, added_tokens=text_added_tokens(tok))
    assert not _accepts(tok, strict.turn_grammar(False), VALID)  # report 2 has no <verification>
    assert not parse_evaluation(VALID, RUBRIC, 2, require_verification=True).valid


def test_random_model_held_to_the_grammar_writes_valid_evaluations(tiny_ckpt, tokenizer):
    """A random-weight model never writes the XML by itself; constrained, every row parses, under its own rubric."""
    from score_lightning.policy.models import load_policy

    torch.manual_seed(0)
    model = load_policy(tiny_ckpt)
    engine = HFEngine(lambda: model, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer)
    rubrics = [RUBRIC, Rubric(("insight", "conciseness", "factual_support"), (0.3, 0.3, 0.4))]
    added = text_added_tokens(tokenizer)
    prompts = [tokenizer("Score the reports.", add_special_tokens=False)["input_ids"],
               tokenizer("Judge them, please.", add_special_tokens=False)["input_ids"]]
    free = engine.generate(prompts, SamplingParams(200, temperature=1.0))
    assert not any(parse_evaluation(tokenizer.decode(g.token_ids), r, 2).valid for g, r in zip(free, rubrics))
    caps = {"think": 120, "query": 80, "section": 120, "reason": 24}  # tiny_score's: the longest fits the budget
    grammars = tuple(ScoringConstraint(r.dims, 2, added_tokens=added, max_chars=caps).turn_grammar(False)
                     for r in rubrics)
    # top_p < 1 and T != 1: the mask acts before the warpers, so nothing allowed is cut to an empty support
    gens = engine.generate(prompts, SamplingParams(1500, temperature=0.7, top_p=0.9, grammars=grammars))
    for g, r in zip(gens, rubrics):
        ev = parse_evaluation(tokenizer.decode(g.token_ids), r, 2)
        assert g.finish_reason == "stop" and ev.valid, (ev.error, tokenizer.decode(g.token_ids)[-300:])
        assert ev.reaches_every_report(2)  # the grammar closes the block and every report
        assert g.logprobs is not None and len(g.logprobs) == len(g.token_ids)
    with pytest.raises(ValueError, match="grammars for"):
        engine.generate(prompts, SamplingParams(10, grammars=grammars[:1]))


def _text_samples(logdir) -> list[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = []
    for events in sorted(logdir.rglob("events.out.tfevents.*")):
        ea = EventAccumulator(str(events), size_guidance={"tensors": 0})
        ea.Reload()
        for tag in ea.Tags().get("tensors", []):
            if tag.startswith("samples/trajectory"):
                out += [e.tensor_proto.string_val[0].decode() for e in ea.Tensors(tag)]
    return out


def test_packaged_cold_start_scores_every_report_pointwise_on_the_cli(tmp_path, cache_dir):
    """The acceptance reading: 3 SCORE steps of tiny_score with ``evaluator.scoring=pointwise`` on the CLI, seed 1,
    from the packaged cold start: every evaluation parses, none is incomplete, each judges one report."""
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, "src/train.py", "experiment=tiny_score", "evaluator.scoring=pointwise",
                           "seed=1", "trainer.max_steps=3", "logging.text_every_n_steps=1", f"paths.cache_dir={cache_dir}",
                           f"paths.output_dir={out}", "trainer.enable_progress_bar=false"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    s = read_scalars(out / "tensorboard")
    assert s["sft/summary/cache_hit"][-1][1] == 1.0  # the packaged cold start, not a fresh one
    assert [v for _, v in s["evaluator/scoring_valid_rate"]] == [1.0] * 3
    assert [v for _, v in s["evaluator/incomplete_rate"]] == [0.0] * 3
    assert s["evaluator/report_scores_valid_rate"][0][1] == 1.0
    assert all(v > 0 for _, v in s["solver/reward_mean"])
    evaluations = [t.split("**evaluation**:", 1)[1] for t in _text_samples(out / "tensorboard")]
    assert len(evaluations) == 3 and all('<report id="1">' in e and '<report id="2">' not in e for e in evaluations)


def test_free_text_caps_come_from_the_config_and_are_validated(tokenizer):
    from helpers import FAST, compose, refusal
    from score_lightning.step.rollouts import rollout_settings

    cfg = compose(FAST)
    settings = rollout_settings(cfg.solver, cfg.evaluator)
    assert settings.constrained_scoring and settings.constrained_max_chars["section"] == 120  # tiny_score's caps
    added = text_added_tokens(tokenizer)
    c = ScoringConstraint(DIMS, 2, added_tokens=added, max_chars={"section": 12})
    short = VALID.replace("Misses json.loads.", "Misses json.")  # 12 characters: within a 12-character cap
    assert _accepts(tokenizer, c.turn_grammar(False), short.replace("[json.dumps] found by search.", "ok"))
    assert not _accepts(tokenizer, c.turn_grammar(False), short)  # its verification note is 29 characters
    with pytest.raises(ValueError, match="unknown field"):
        ScoringConstraint(DIMS, 2, max_chars={"notes": 5})
    for bad in ("evaluator.constrained_max_chars.section=0", "+evaluator.constrained_max_chars.notes=5",
                "evaluator.constrained_scoring=maybe"):
        assert "evaluator.constrained" in refusal(FAST + [bad])


def test_probe_scoring_script_reports_validity_and_separation(cache_dir):
    """``scripts/probe_scoring.py`` (the BENCHMARKS figures on whether scores carry signal) on two groups: each
    protocol scores the same reports under the sampled and the fallback rubric, each read both ways."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, "scripts/probe_scoring.py", "--groups", "2", "--demos", "2", "--scoring",
                           "joint,pointwise", "--readout", "sampled,expected", f"paths.cache_dir={cache_dir}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # without --model: the recipe's own cold start, installed into the cache as training installs it
    model = next(line for line in proc.stdout.splitlines() if line.startswith("model: "))
    assert model.endswith("(the recipe's own cold start)") and f"{cache_dir}/sft/sft-" in model, model
    lines = [dict(kv.split("=", 1) for kv in line.split()) for line in proc.stdout.splitlines()
             if line.startswith("protocol=")]
    assert [(d["protocol"], d["rubric"], d["readout"]) for d in lines] == [
        (p, r, o) for p in ("joint", "pointwise") for r in ("sampled", "fallback") for o in ("sampled", "expected")]
    for last in lines:
        assert set(last) == {"protocol", "rubric", "readout", "scoring_valid_rate", "report_valid_rate",
                             "incomplete_rate", "gap_valid", "gap_valid_ci", "gap_cited", "gap_cited_ci", "tau_valid",
                             "tau_valid_ci", "tau_groups", "tau_excluded"}
        assert float(last["scoring_valid_rate"]) == 1.0 and float(last["report_valid_rate"]) == 1.0  # constrained
        assert int(last["tau_groups"]) + int(last["tau_excluded"]) == 2  # every group is averaged or counted out
    assert sum("Kendall tau-b of score vs q" in line for line in proc.stdout.splitlines()) == 8
    fits = [line for line in proc.stdout.splitlines() if line.startswith("demo fit ")]
    assert fits and all("value target" in line and "verification start greedy-correct" in line for line in fits)


def test_pointwise_scoring_under_the_grammar_parses_every_report(tiny_ckpt, tokenizer, bm25):
    """``evaluator.scoring=pointwise`` with the grammar for one report: a random model's K evaluations of a group,
    sampled as one batch, each parse as a complete evaluation of its one report."""
    from helpers import FAST, compose
    from score_lightning.harness.state import HarnessState
    from score_lightning.policy.models import load_policy
    from score_lightning.step.evaluations import group_evaluations
    from score_lightning.step.rollouts import rollout_settings, scoring_rollouts

    cfg = compose(FAST + ["evaluator.scoring=pointwise", "evaluator.constrained_scoring=true", "solver.num_rollouts=3",
                          "evaluator.max_response_tokens=700", "evaluator.show_retrieved=true"])
    settings = rollout_settings(cfg.solver, cfg.evaluator)
    torch.manual_seed(0)
    model = load_policy(tiny_ckpt)
    engine = HFEngine(lambda: model, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer)
    state = HarnessState()
    reports = [["json.dumps writes JSON [json.dumps]. Conclusion: use it.", None, "No citation here at all."]]
    sources = [[["json.dumps", "json.loads"], [], ["os.path"]]]
    trajs = scoring_rollouts(engine, tokenizer, bm25, ["How do I write JSON?"], reports, [RUBRIC], state, settings,
                             sources)
    assert len(trajs) == 3
    group = group_evaluations(trajs, [RUBRIC], 3, "pointwise", state.process_constraints, tokenizer)[0]
    assert group.evaluations_valid == (True, True, True) and group.complete, [t.model_text(tokenizer) for t in trajs]
    assert all(group.report_valid(k) for k in (1, 2, 3))
