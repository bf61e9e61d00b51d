"""``evaluator.score_readout=expected``: each score read as the model's expected value over 0..10.

Checked against hand computations (the rule on a known distribution, the parse of substituted values), against an
independent teacher-forced forward of the model at every value position of a fast-forward decode (tiny and
Qwen2.5 tokenizers, forced runs whole or cut), and the refusals where nothing can read the distribution.
"""

from __future__ import annotations

import pytest
import torch

from score_lightning.harness.state import ProcessConstraints
from score_lightning.roles.evaluation import parse_evaluation, with_values
from score_lightning.roles.rubric import Rubric
from score_lightning.rollout.constrained import ScoringConstraint, allowed_tokens, grammar_matchers, text_added_tokens
from score_lightning.rollout.engine import SamplingParams
from score_lightning.rollout.hf_engine import HFEngine
from score_lightning.rollout.trajectory import Trajectory
from score_lightning.rollout.value_readout import ValueReadout, expected_value, is_ambiguous, token_value
from score_lightning.step.evaluations import group_evaluations

RUBRIC = Rubric(("factual_support", "citation_grounding"), (0.6, 0.4))
CAPS = {"think": 8, "query": 8, "section": 10, "reason": 6}


def test_expected_value_splits_the_one_branch_between_1_and_10():
    """Allowed first tokens 0, 1, 5, 9, 10 with weights summing to 0.8 (renormalised); after "1" the model puts
    0.25 on "0" (-> 10) and 0.75 on closing tokens (-> 1):
    E = (0.1*0 + 0.2*(0.25*10 + 0.75*1) + 0.3*5 + 0.1*9 + 0.1*10) / 0.8 = 4.05 / 0.8 = 5.0625."""
    after_one = [("0", 0.05), ('"', 0.1), ('"/>', 0.05)]  # unnormalised: 0.25 / 0.75 of 0.2
    first = [("0", 0.1, None), ("1", 0.2, after_one), ("5", 0.3, None), ("9", 0.1, None), ("10", 0.1, None)]
    assert expected_value(first) == pytest.approx(5.0625, abs=1e-12)
    # a token that closes the value itself ('7"') is worth its digits; "1" with a closing quote is 1, not a branch
    assert expected_value([('7"', 0.5, None), ('1"', 0.5, None)]) == pytest.approx(4.0)
    assert is_ambiguous("1") and not is_ambiguous("10") and not is_ambiguous('1"') and not is_ambiguous("2")
    assert token_value("1", "0") == 10 and token_value("1", '"') == 1 and token_value('10"') == 10
    with pytest.raises(ValueError, match="next distribution"):
        expected_value([("1", 1.0, None)])
    with pytest.raises(ValueError, match="0..10"):
        token_value("1", "1")


@pytest.mark.parametrize("which,ten_is_one_token", [("tokenizer", True), ("qwen_tokenizer", False),
                                                    ("llama_tokenizer", True)])
def test_how_each_tokenizer_writes_values(which, ten_is_one_token, request):
    """Tiny and Qwen2.5 encode 10 as "1" "0"; Llama-3 as one "10" token. The tiny vocabulary (and Llama's) also has a
    "10" token the grammar may pick. Either way "1" is the one ambiguous first token, so the readout branches on it."""
    tok = request.getfixturevalue(which)
    readout = ValueReadout(tok, len(tok))
    assert [tok.decode([i]) for i in tok("10", add_special_tokens=False)["input_ids"]] == \
        (["10"] if which == "llama_tokenizer" else ["1", "0"])
    assert ("10" in readout.texts.values()) == ten_is_one_token
    ambiguous = [t for t in readout.texts.values() if is_ambiguous(t)]
    assert ambiguous == ["1"]
    assert all(readout.digit_led[tok(str(v), add_special_tokens=False)["input_ids"][0]] for v in range(11))


def _teacher_forced(model, tok, prompt: list[int], tokens: list[int], k: int, grammar: str) -> float:
    """E[value] at generated position k, computed from scratch: full forwards over prompt + tokens[:k] (and + "1"),
    a fresh matcher for the masks, and the rule written out (this tokenizer has no digit-and-quote tokens)."""
    vocab = int(model.get_output_embeddings().weight.shape[0])
    m = grammar_matchers([grammar], tok, vocab, [tok.eos_token_id])[0]
    for t in tokens[:k]:
        m.consume_token(t)
    allowed = torch.nonzero(allowed_tokens([m], vocab)[0]).view(-1).tolist()
    with torch.no_grad():
        p = torch.softmax(model(torch.tensor([prompt + tokens[:k]])).logits[0, -1].float(), -1)
    total, out = sum(float(p[i]) for i in allowed), 0.0
    for i in allowed:
        text = tok.decode([i])
        if text != "1":
            out += float(p[i]) * int(text)
            continue
        m1 = m.deep_copy()
        m1.consume_token(i)
        after = torch.nonzero(allowed_tokens([m1], vocab)[0]).view(-1).tolist()
        with torch.no_grad():
            q = torch.softmax(model(torch.tensor([prompt + tokens[:k] + [i]])).logits[0, -1].float(), -1)
        q0 = sum(float(q[j]) for j in after if tok.decode([j]).startswith("0")) / sum(float(q[j]) for j in after)
        out += float(p[i]) * (10 * q0 + 1 * (1 - q0))
    return out / total


@pytest.mark.parametrize("which,budget,temperature", [("tiny_ckpt", 64, 0.0), ("qwen_ckpt", 64, 0.0),
                                                    ("tiny_ckpt", 3, 0.7)])
def test_fast_forward_reads_the_models_value_distribution(which, budget, temperature, request):
    """Two rows (different rubrics, so their values come at different forwards) decoded with the readout: one
    readout per score tag, each equal to a teacher-forced computation at its position from the model's T = 1
    distribution (also when sampling at 0.7; the value position follows a forced ``value="`` run, cut over several
    forwards when ``budget`` is 3), and the ids and log-probs are those of the same decode without the readout (the
    branch column is invisible to everything after it, and it samples nothing)."""
    from score_lightning.policy.models import load_policy, load_tokenizer

    ckpt = request.getfixturevalue(which)
    tok = load_tokenizer(ckpt)
    torch.manual_seed(0)
    model = load_policy(ckpt).eval()
    rubrics = [RUBRIC, Rubric(("insight", "conciseness", "factual_support"), (0.3, 0.3, 0.4))]
    prompts = [tok("Score the reports.", add_special_tokens=False)["input_ids"],
               tok("Judge them, please now.", add_special_tokens=False)["input_ids"]]
    added = text_added_tokens(tok)
    grammars = tuple(ScoringConstraint(r.dims, 2, added_tokens=added, max_chars=CAPS).turn_grammar(False)
                     for r in rubrics)
    engine = HFEngine(lambda: model, tok.pad_token_id, tok.eos_token_id, tok, fast_forward_tokens=budget)
    torch.manual_seed(1)
    plain = engine.generate(prompts, SamplingParams(400, temperature=temperature, grammars=grammars))
    torch.manual_seed(1)
    read = engine.generate(prompts, SamplingParams(400, temperature=temperature, grammars=grammars, value_readout=True))
    for g, p, prompt, grammar, rubric in zip(read, plain, prompts, grammars, rubrics):
        assert g.token_ids == p.token_ids and "value_readouts" not in p.extra
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(p.logprobs), atol=1e-4, rtol=0)
        text = tok.decode(g.token_ids)
        ev = parse_evaluation(text, rubric, 2)
        readouts = g.extra["value_readouts"]
        assert ev.valid and len(readouts) == 2 * len(rubric.dims)
        for k, value in readouts:
            assert tok.decode(g.token_ids[:k]).endswith('value="')  # the position of the value's first token
            assert value == pytest.approx(_teacher_forced(model, tok, prompt, g.token_ids, k, grammar), abs=1e-4)
        expected = parse_evaluation(with_values(text, [v for _, v in readouts]), rubric, 2)
        flat = [expected.reports[r].scores[d] for r in (1, 2) for d in rubric.dims]
        assert flat == pytest.approx([v / 10 for _, v in readouts], abs=1e-12)


def test_engines_that_cannot_read_the_distribution_refuse(tiny_ckpt, tokenizer):
    from score_lightning.policy.models import load_policy
    from score_lightning.rollout.scripted import ProtocolResponder, ScriptedEngine

    model = load_policy(tiny_ckpt)
    grammar = ScoringConstraint(RUBRIC.dims, 1, added_tokens=text_added_tokens(tokenizer)).turn_grammar(False)
    params = SamplingParams(20, temperature=0.0, grammars=(grammar,), value_readout=True)
    prompt = [tokenizer("Score it.", add_special_tokens=False)["input_ids"]]
    with pytest.raises(ValueError, match="fast-forward"):
        HFEngine(lambda: model, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer,
                 fast_forward=False).generate(prompt, params)
    with pytest.raises(ValueError, match="scripted"):
        ScriptedEngine(tokenizer, ProtocolResponder()).generate(prompt, params)


class _Chars:
    """A tokenizer stub: one id per character (``model_text`` decodes what the trajectory holds)."""

    @staticmethod
    def decode(ids):
        return "".join(chr(i) for i in ids)


def _traj(text: str, values: list[float]) -> Trajectory:
    ids = [ord(c) for c in text]
    return Trajectory([], ids, [1] * len(ids), value_readouts=[(i, v) for i, v in enumerate(values)])


def _report(rid: int, a: str, b: str) -> str:
    return (f'<report id="{rid}"><scores><score dim="factual_support" value="{a}" reason="x"/>'
            f'<score dim="citation_grounding" value="{b}"/></scores></report>')


@pytest.mark.parametrize("protocol", ["joint", "pointwise"])
def test_the_expected_values_become_the_parsed_scores_in_both_protocols(protocol):
    """Written 7, 10 | 0, 3; read 6.5, 9.25 | 0.75, 2.5 -> scores /10, in report and rubric order; ``sampled``
    still reads the written ones; a trajectory that read fewer values than it wrote tags is refused."""
    written, read = [("7", "10"), ("0", "3")], [(6.5, 9.25), (0.75, 2.5)]
    if protocol == "joint":
        body = "".join(_report(i + 1, *w) for i, w in enumerate(written))
        text = f"<think>ok</think><report_evaluations>{body}</report_evaluations>"
        trajs = [_traj(text, [v for r in read for v in r])]
    else:
        trajs = [_traj(f"<report_evaluations>{_report(1, *w)}</report_evaluations>", list(r))
                 for w, r in zip(written, read)]
    pc = ProcessConstraints(require_verification=False)
    exp = group_evaluations(trajs, [RUBRIC], 2, protocol, pc, _Chars(), "expected")[0]
    assert exp.parse.valid and sum(exp.parse.score_matrix(RUBRIC, 2), []) == pytest.approx([0.65, 0.925, 0.075, 0.25])
    samp = group_evaluations(trajs, [RUBRIC], 2, protocol, pc, _Chars(), "sampled")[0]
    assert sum(samp.parse.score_matrix(RUBRIC, 2), []) == pytest.approx([0.7, 1.0, 0.0, 0.3])
    short = [_traj(tr.model_text(_Chars()), [5.0]) for tr in trajs]
    with pytest.raises(ValueError, match="expected values were read"):
        group_evaluations(short, [RUBRIC], 2, protocol, pc, _Chars(), "expected")
    with pytest.raises(ValueError, match="score_readout"):
        group_evaluations(trajs, [RUBRIC], 2, protocol, pc, _Chars(), "mean")


def test_with_values_replaces_only_the_value_attribute():
    text = ('<score dim="a" value="7" reason="value=8"/><score value="2" dim="b"/>'
            '<score dim="c" value="4"')  # the last tag was cut: its read value is left over
    out = with_values(text, [6.25, 1.0, 3.5])
    assert out == '<score dim="a" value="6.25" reason="value=8"/><score value="1.0" dim="b"/><score dim="c" value="4"'


def test_config_validation_refuses_expected_where_it_cannot_work():
    from helpers import FAST, compose
    from score_lightning.launch.config_validation import ConfigError, validate_config
    from score_lightning.step.rollouts import rollout_settings

    cfg, default = compose(FAST + ["evaluator.score_readout=expected"]), compose(FAST)
    validate_config(cfg)
    # the scoring loop and the reward's parse both read evaluator.score_readout
    assert rollout_settings(cfg.solver, cfg.evaluator).score_readout == cfg.evaluator.score_readout == "expected"
    assert rollout_settings(default.solver, default.evaluator).score_readout == "sampled"  # the default
    for bad, why in [(["evaluator.constrained_scoring=false"], "constrained_scoring=true"),
                     (["rollout=scripted"], "rollout=scripted"),
                     (["rollout.grammar_fast_forward=false"], "grammar_fast_forward=true"),
                     (["rollout=vllm"], "not vLLM"),
                     (["strategy=fsdp", "trainer.devices=2"], "unsharded")]:
        with pytest.raises(ConfigError, match="score_readout=expected needs") as err:
            validate_config(compose(FAST + ["evaluator.score_readout=expected", *bad]))
        assert why in str(err.value), str(err.value)
    validate_config(compose(FAST + ["evaluator.score_readout=expected", "rollout=vllm", "actor.shared=false"]))
    # a shared actor on vLLM with its evaluator role on HF generate() (rollout.evaluator_engine=hf) reads it too
    validate_config(compose(FAST + ["evaluator.score_readout=expected", "rollout=vllm", "rollout.evaluator_engine=hf"]))
    with pytest.raises(ConfigError, match="grammar_fast_forward=true"):
        validate_config(compose(FAST + ["evaluator.score_readout=expected", "rollout=vllm", "rollout.evaluator_engine=hf",
                                        "rollout.grammar_fast_forward=false"]))
    with pytest.raises(ConfigError, match="rollout.evaluator_engine='vlm': allowed one of: vllm, hf"):
        validate_config(compose(FAST + ["rollout=vllm", "rollout.evaluator_engine=vlm"]))
    with pytest.raises(ConfigError, match="score_readout='mean'"):
        validate_config(compose(FAST + ["evaluator.score_readout=mean"]))
