"""One SCORE step's text protocol, tokenizer by tokenizer: Qwen2.5 and Llama-3 read it exactly as the tiny one.

The scripted engine (``rollout/scripted.py``) writes a valid rubric, K cited reports and scoring XML
through the real stages (rubric sampling, the agent loop, parsing, reward assembly). In the tiny
tokenizer every tag is one token; in Qwen2.5's and Llama-3's it is several BPE pieces, the piece
that completes a tag may carry more text (``>\\n``), and BPE would merge text across observation
boundaries if anything re-tokenised. Every parsed result, mask and reward must nevertheless be the
same as with the tiny tokenizer.
"""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from score_lightning import protocol as P
from score_lightning.harness.scheduler import DimensionScheduler
from score_lightning.harness.state import HarnessState
from score_lightning.retrieval.base import SearchHit
from score_lightning.roles.answer import extract_conclusion
from score_lightning.roles.evidence import EvidenceDoc
from score_lightning.roles.evaluation import parse_evaluation
from score_lightning.roles.rubric import parse_rubric
from score_lightning.rollout.agent import AgentConfig
from score_lightning.rollout.scripted import ProtocolResponder, ScriptedEngine, ScriptRequest
from score_lightning.step.reward_assembly import assemble_rewards, parse_answers
from score_lightning.step.rollouts import RolloutSettings, scoring_rollouts, solver_rollouts
from score_lightning.step.rubric_stage import RubricSampling, sample_step_rubric

QUERIES = ["How does json.dumps handle non-ASCII text?", "When should I use collections.OrderedDict?"]
K = 3
STATE = HarnessState.from_dict({"process_constraints": {"require_verification": True, "require_gap_analysis": True}})
SETTINGS = RolloutSettings(
    num_rollouts=K, max_prompt_tokens=4096,
    solver=AgentConfig(max_tool_calls=2, max_response_tokens=2048, max_observation_tokens=512, finish_tag=P.ANSWER_CLOSE),
    scoring=AgentConfig(max_tool_calls=1, max_response_tokens=2048, max_observation_tokens=512, finish_tag=P.EVALS_CLOSE),
    max_report_tokens=1024, conclusion_line=True, agent="react", options=None, constrained_scoring=False,
    constrained_max_chars=None, scoring_protocol="joint", show_retrieved=False, scoring_max_prompt_tokens=None,
    score_readout="sampled", show_passages=False, passage_tokens=48, max_cited_passages=4)
# the reward, evaluator and verifier nodes as the step reads them (a required citation, joint scoring, tau 1)
REWARD = OmegaConf.create({"require_citation": True, "min_answer_chars": 20, "citations": "any"})
EVALUATOR = OmegaConf.create({"source": "policy", "scoring": "joint", "score_readout": "sampled",
                              "on_incomplete": "validity"})
VERIFIER = OmegaConf.create({"enabled": True, "min_search_depth": 1, "tau_from_harness": False, "zero": "reward"})
RUBRIC = RubricSampling(max_tokens=512, temperature=1.0, max_prompt_tokens=4096, max_queries=8)


class TrickyRetriever:
    """Passages whose text BPE would merge with the tags around them (punctuation, spaces, non-ASCII)."""

    def search(self, queries, topk):
        return [[SearchHit(f"{q.split()[-1].strip('?.')}.doc", f' "{q}"\n  ends with punctuation, naïve “quotes”.', 1.0),
                 SearchHit("json.dumps", "Serialize obj to a JSON formatted str:", 0.5)][:topk] for q in queries]


class Suffixed:
    """The protocol script, with text after every reply (which a sampler stops inside of, or not at all)."""

    def __init__(self, suffix: str):
        self.inner, self.suffix = ProtocolResponder(verify_searches=1), suffix

    def __call__(self, req: ScriptRequest) -> str:
        return self.inner(req) + self.suffix


def _runs(traj) -> list[tuple[int, list[int]]]:
    """Maximal runs of equal mask: ``[(mask, ids), ...]`` in order."""
    runs: list[tuple[int, list[int]]] = []
    for t, m in zip(traj.response_ids, traj.response_mask):
        if runs and runs[-1][0] == m:
            runs[-1][1].append(t)
        else:
            runs.append((m, [t]))
    return runs


def _check_masks(tok, traj) -> list[str]:
    """Each mask-0 run is exactly the separately tokenised observation; decoding concatenates. Returns the
    observation texts."""
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    runs, observations = _runs(traj), []
    for mask, ids in runs:
        text = tok.decode(ids)
        if mask == 0:
            head, tail = "\n" + P.OBS_OPEN, P.OBS_CLOSE + "\n"
            assert text.startswith(head) and text.endswith(tail), text
            parts = [b.rstrip("\n").removesuffix(P.OBS_CLOSE) for b in text.split(P.OBS_OPEN)[1:]]
            assert ids == [i for b in parts for i in enc("\n") + enc(P.OBS_OPEN) + enc(b) + enc(P.OBS_CLOSE) + enc("\n")]
            observations.extend(parts)
    assert traj.response_text(tok) == "".join(tok.decode(ids) for _, ids in runs)
    assert traj.model_text(tok) == "".join(tok.decode(ids) for m, ids in runs if m)
    return observations


def _step(tok, suffix: str = "") -> dict:
    """Run the text side of one SCORE step with the scripted engine; return everything it parsed and rewarded."""
    engine, retriever = ScriptedEngine(tok, Suffixed(suffix)), TrickyRetriever()
    state = STATE
    evidence = [[EvidenceDoc("json.dumps", "Serialize obj to a JSON formatted str.")], []]
    sample = sample_step_rubric(engine, tok, QUERIES, evidence, state,
                                DimensionScheduler(list(state.dimension_pool)), RUBRIC)
    assert sample.valid, sample.error
    rubrics = [sample.rubric] * len(QUERIES)
    solver = solver_rollouts(engine, tok, retriever, QUERIES, rubrics, state, SETTINGS)
    answers = parse_answers(solver, tok, REWARD)
    reports = [[a.answer if a.answer else None for a in answers[i:i + K]] for i in range(0, len(answers), K)]
    scoring = scoring_rollouts(engine, tok, retriever, QUERIES, reports, rubrics, state, SETTINGS)
    rw = assemble_rewards(answers, scoring, rubrics, state, K, EVALUATOR, VERIFIER, tok)
    span = tok.decode([t for t, m in zip(sample.response_ids, sample.train_mask) if m])
    trajs = solver + scoring
    return {
        "rubric": (sample.rubric, parse_rubric(span, state)), "rubric_tail": tok.decode(sample.response_ids)[len(span):],
        "observations": [_check_masks(tok, t) for t in trajs],
        "actions": [(t.tool_calls, t.invalid_actions, t.search_queries, t.retrieved_ids, t.finished, t.truncated)
                    for t in trajs],
        "answers": answers, "conclusions": [extract_conclusion(a.answer or "") for a in answers],
        "evaluations": [parse_evaluation(t.model_text(tok), sample.rubric, K, require_verification=True,
                                         require_gap_analysis=True) for t in scoring],
        "rewards": (rw.rewards.tolist(), rw.validity.tolist(), [m.tolist() for m in rw.item_scores], rw.depth.tolist(),
                    rw.process_ok.tolist(), rw.eval_valid),
        "model_text": [t.model_text(tok) for t in trajs],
        "drifts": any(tok(t.response_text(tok), add_special_tokens=False)["input_ids"] != t.response_ids for t in trajs),
    }


@pytest.fixture(scope="module")
def tiny_step(tokenizer) -> dict:
    return _step(tokenizer)


def _same_protocol(a: dict, b: dict, with_text: bool) -> None:
    keys = ["rubric", "observations", "actions", "answers", "conclusions", "evaluations", "rewards"]
    for key in keys + (["model_text"] if with_text else []):
        assert a[key] == b[key], key


@pytest.mark.parametrize("kind", ["qwen", "llama"])
def test_step_text_protocol_is_tokenizer_independent(kind, request, tiny_step):
    tok = request.getfixturevalue(f"{kind}_tokenizer")
    step = _step(tok)
    _same_protocol(step, tiny_step, with_text=True)
    # the step exercised what it should: every tag, valid and invalid reports, non-zero rewards
    text = "".join(step["model_text"]) + "".join(o for obs in step["observations"] for o in obs)
    assert all(tag in text for tag in (P.THINK_OPEN, P.THINK_CLOSE, P.SEARCH_OPEN, P.SEARCH_CLOSE, P.ANSWER_OPEN,
                                       P.ANSWER_CLOSE, P.EVALS_OPEN, P.EVALS_CLOSE, P.REPORT_CLOSE, P.VERIFICATION_OPEN,
                                       P.VERIFICATION_CLOSE, P.GAP_OPEN, P.GAP_CLOSE, P.SCORES_OPEN, P.SCORES_CLOSE))
    assert step["rubric"][1].valid and all(step["observations"])
    rewards, validity = step["rewards"][0], step["rewards"][1]
    assert 0 < sum(validity) < len(validity) and max(rewards) > 1.0
    assert step["drifts"]  # re-tokenising the text would merge across boundaries: the ids were kept instead


@pytest.mark.parametrize("kind", ["qwen", "llama"])
def test_text_after_a_tag_in_the_same_token_is_kept_and_read(kind, request, tiny_step):
    """Replies go on after each closing tag ("\\n"): a real tokenizer's ``>\\n`` token completes the tag
    and carries the newline. The turn keeps that token, and every action, parse and reward is unchanged."""
    tok = request.getfixturevalue(f"{kind}_tokenizer")
    step = _step(tok, suffix="\n")
    _same_protocol(step, tiny_step, with_text=False)
    assert step["rubric_tail"] == "" and tok.decode(tok("</dimensions>\n", add_special_tokens=False)["input_ids"][-1:]) == ">\n"
    solver_text = step["model_text"][0]
    assert f"{P.SEARCH_CLOSE}\n" in solver_text and solver_text.endswith(f"{P.ANSWER_CLOSE}\n")
    closing = (P.SEARCH_CLOSE, P.ANSWER_CLOSE, P.EVALS_CLOSE)
    unsuffixed = [t for t in step["model_text"]]
    for tag in closing:
        unsuffixed = [t.replace(tag + "\n", tag) for t in unsuffixed]
    assert unsuffixed == tiny_step["model_text"]
