"""DR Tulu's citation reward through the external judge (``reward.citation_judge``): claims, the judge's reply,
the per-claim precision / recall / F1, and a real training step whose rewards and advantages are checked by hand,
a failed citation judgement dropping its report."""

from __future__ import annotations

import re

import pytest

from openai_stub import OpenAIStub, Reply
from score_lightning.clients.chat import ReplyError
from score_lightning.methods.judge.citation_claims import ClaimVerdict, citation_score, claim_scores, report_claims
from score_lightning.methods.judge.citation_prompts import (
    CITATION_CHECK_SYSTEM, citation_check_messages, citation_check_reader,
)
from test_judge_reward import B, K, ROW, Solver, _cfg, _grpo, _train, evaluation


def test_claims_and_dr_tulus_per_claim_scores():
    claims = report_claims("Alpha holds [a] [b]. Beta is a fact.\nConclusion: alpha.", {"a", "b"})
    assert [(c.text, c.cited) for c in claims] == [("Alpha holds.", ("a", "b")), ("Beta is a fact.", ()),
                                                   ("Conclusion: alpha.", ())]
    cited, uncited = claims[0], claims[1]
    # cited: recall from support, precision = share of relevant cited passages; F1 = 2PR/(P+R)
    assert claim_scores(cited, ClaimVerdict("full", {"a": True, "b": True}), {"a", "b"}) == (1.0, 1.0, 1.0)
    assert claim_scores(cited, ClaimVerdict("partial", {"a": True, "b": False}), {"a", "b"}) == \
        pytest.approx((0.5, 0.5, 0.5))
    assert claim_scores(cited, ClaimVerdict("full", {"a": True, "b": True}), {"a"}) == \
        pytest.approx((0.5, 1.0, 2 / 3))  # [b] was never retrieved: not a supporting passage, whatever the judge says
    # uncited: precision 1, recall 0 when it needed a source
    assert claim_scores(uncited, ClaimVerdict(needs_citation=True), set()) == (1.0, 0.0, 0.0)
    assert claim_scores(uncited, ClaimVerdict(needs_citation=False), set()) == (1.0, 1.0, 1.0)
    assert citation_score([], [], set()) == (0.0, 0.0, 0.0)


def test_the_reply_must_answer_every_claim_and_every_cited_passage():
    claims = report_claims("Alpha holds [a]. Beta is a fact.", {"a"})
    read = citation_check_reader(claims)
    ok = read('{"claims": [{"id": 1, "support": "partial", "passages": {"a": "relevant"}}, '
              '{"id": 2, "needs_citation": true}]}')
    assert ok == [ClaimVerdict("partial", {"a": True}), ClaimVerdict(needs_citation=True)]
    for bad, why in [('{"claims": [{"id": 1, "support": "full", "passages": {"a": "relevant"}}]}', "claims \\[2\\]"),
                     ('{"claims": [{"id": 1, "support": "mostly", "passages": {"a": "relevant"}}, '
                      '{"id": 2, "needs_citation": false}]}', "support must be"),
                     ('{"claims": [{"id": 1, "support": "full", "passages": {}}, {"id": 2, "needs_citation": false}]}',
                      "passage \\[a\\]"),
                     ("no json here", "no JSON object")]:
        with pytest.raises(ReplyError, match=why):
            read(bad)
    msgs = citation_check_messages("Why?", claims, {"a": "Alpha holds for every input."})
    assert msgs[0]["content"] == CITATION_CHECK_SYSTEM
    assert "1. Alpha holds. (cites: [a])" in msgs[1]["content"] and "2. Beta is a fact. (cites: no citation)" in \
        msgs[1]["content"] and "[a] Alpha holds for every input." in msgs[1]["content"]


#: the citation judge's verdict per row: (support, passage relevant, the conclusion needs a citation), or a fault
CITES = {0: ("full", True, False), 1: ("partial", True, False), 2: ("none", False, True), 3: "500",
         4: ("full", True, True), 5: ("full", False, False), 6: ("partial", False, False), 7: ("none", True, False)}


def _citation_reply(prompt: str):
    plan = CITES[int(ROW.search(prompt).group(1))]
    if plan == "500":
        return Reply(status=500)
    passages = re.search(r"Passages:\n\[([^\]]+)\] (.+)", prompt)
    assert passages and "never retrieved" not in passages.group(2)  # the text its own search showed the solver
    support, relevant, needs = plan
    return ('{"claims": [{"id": 1, "support": "%s", "passages": {"%s": "%s"}}, {"id": 2, "needs_citation": %s}]}'
            % (support, passages.group(1), "relevant" if relevant else "irrelevant", str(needs).lower()))


def _judge(request: dict):
    system, prompt = request["messages"][0]["content"], request["messages"][1]["content"]
    return _citation_reply(prompt) if system == CITATION_CHECK_SYSTEM else evaluation(prompt, 5)


def _f1(p, r):
    return 0.0 if p + r == 0 else 2 * p * r / (p + r)


def test_the_citation_term_by_hand_and_a_failed_check_drops_its_report(tmp_path, tiny_ckpt, corpus_file):
    with OpenAIStub(content=_judge) as stub:
        steps = _train(_cfg(tmp_path, stub, "trainer.max_steps=1", "reward.citation_judge.enabled=true",
                            "reward.citation_judge.weight=0.5"), Solver())
    rw, m, adv = steps[0]["rewards"], steps[0]["metrics"], steps[0]["solver"].advantages.tolist()
    support = {"full": 1.0, "partial": 0.5, "none": 0.0}
    terms = {}
    for row, plan in CITES.items():
        if plan == "500":
            continue
        s, relevant, needs = plan
        cited = _f1(float(relevant), support[s])  # "A report from row N on the question [id]."
        conclusion = _f1(1.0, 0.0 if needs else 1.0)  # "Conclusion: cN." cites nothing
        terms[row] = (cited + conclusion) / 2
    expected = [1.5 + 0.5 * terms[r] if r in terms else None for r in range(B * K)]  # 1 + 5/10, plus the term
    assert [x for x, e in zip(rw.rewards.tolist(), expected) if e is not None] == \
        pytest.approx([e for e in expected if e is not None], abs=1e-6)
    assert rw.excluded.tolist() == [r == 3 for r in range(B * K)]
    assert adv[3] == 0.0 and [adv[i] for i in (0, 1, 2)] == pytest.approx(_grpo(expected[:3]), abs=1e-5)
    assert adv[4:] == pytest.approx(_grpo(expected[4:]), abs=1e-5)
    assert m["judge/failed_rate"] == pytest.approx(1 / 16)  # 8 scoring + 8 citation judgements, one 500
    assert m["solver/citation_judge_f1"] == pytest.approx(sum(terms.values()) / 7)
    assert m["solver/citation_judge_recall"] == pytest.approx(
        sum((support[p[0]] + (0.0 if p[2] else 1.0)) / 2 for p in CITES.values() if p != "500") / 7)
