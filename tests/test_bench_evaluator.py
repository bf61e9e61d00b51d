"""scripts/bench_evaluator.py: its metrics against hand computations, the pairs it builds, the stored pair set,
the external-judge path over a real loopback server, and one end-to-end run on the scripted engine."""

from __future__ import annotations

import json
import math
import random
import re
import subprocess
import sys

import pytest
from helpers import ROOT
from openai_stub import OpenAIStub, Reply

from score_lightning import protocol as P
from score_lightning.evaluation import pair_metrics as M
from score_lightning.evaluation.pair_build import EDIT_KINDS, VALID, Sample, build_pairs, grounded_answer_valid
from score_lightning.evaluation.pair_scoring import judge_scores
from score_lightning.evaluation.pair_set import PairSetError, manifest_path, pairs_text, read_pair_set, write_pair_set
from score_lightning.clients.chat import ChatClient
from score_lightning.harness.state import HarnessState
from score_lightning.data.items import EvidenceItem
from score_lightning.rewards.items import item_recall
from score_lightning.roles.rubric import fallback_rubric

LAST_LINE = re.compile(
    r"^pairs=(\d+) pair_acc=(\S+) pair_acc_ci=\[(\S+),(\S+)\] valid_pairs=(\d+) valid_pair_acc=(\S+) "
    r"valid_pair_acc_ci=\[(\S+),(\S+)\] auc=(\S+) cohen_d=(\S+)$")


# ------------------------------------------------------------------------------------------------ metrics
def test_metrics_match_hand_computations_and_ties_count_half():
    better, worse = [3, 2, 1, 1], [1, 2, 2, 0]
    # pairs: win, tie, loss, win -> (1 + 0.5 + 0 + 1) / 4
    assert M.pair_accuracy(better, worse) == pytest.approx(0.625)
    # pooled AUC = P(better side > worse side) over all 16 cross pairs, ties half: (4 + 3 + 1.5 + 1.5) / 16
    assert M.pooled_auc(better, worse) == pytest.approx(10 / 16)
    # Cohen's d: means 1.75 and 1.25, both sample variances 2.75 / 3, so d = 0.5 / sqrt(2.75 / 3)
    assert M.cohens_d(better, worse) == pytest.approx(0.5 / math.sqrt(2.75 / 3))
    assert M.pair_accuracy([2, 2], [2, 2]) == 0.5 and M.pooled_auc([2, 2], [2, 2]) == 0.5
    assert math.isnan(M.cohens_d([2, 2], [2, 2]))  # no spread: undefined, never infinite


def test_bootstrap_resamples_queries_deterministically():
    # query a: the better side wins both pairs; query b: loses both. A resample holds aa, ab, ba or bb.
    query, better, worse = ["a", "a", "b", "b"], [1, 1, 0, 0], [0, 0, 1, 1]
    s1 = M.summarise(query, better, worse, resamples=400, seed=0)
    s2 = M.summarise(query, better, worse, resamples=400, seed=0)
    assert s1 == s2
    assert s1.pair_acc.value == 0.5 and (s1.pair_acc.lo, s1.pair_acc.hi) == (0.0, 1.0)
    assert s1.pairs == 4 and s1.queries == 2 and s1.ties == 0
    # one query: every resample is the data itself
    one = M.summarise(["a"] * 3, [2, 1, 3], [1, 1, 0], resamples=50)
    assert one.pair_acc.lo == one.pair_acc.hi == one.pair_acc.value == pytest.approx(2.5 / 3)
    # the interval is over queries: a per-pair bootstrap would be narrower than this one
    lo, hi = M.query_bootstrap(query, better, worse, M.pair_accuracy, resamples=400, seed=0)
    assert (lo, hi) == (s1.pair_acc.lo, s1.pair_acc.hi)


def test_summaries_per_kind_and_the_last_line_parse():
    rows = [("q1", "no_citation", 0.9, 0.1), ("q2", "no_citation", 0.5, 0.5), ("q1", "empty", 0.8, 0.0),
            ("q2", VALID, 0.4, 0.6), ("q3", VALID, 0.7, 0.2)]
    s = M.summarise_kinds(rows, EDIT_KINDS, resamples=100)
    assert list(s) == ["no_citation", "empty", "degraded", "valid", "all"]
    assert s["no_citation"].pair_acc.value == 0.75 and s["degraded"].pairs == 3 and s["valid"].pairs == 2
    assert s["valid"].pair_acc.value == 0.5 and s["all"].pairs == 5
    m = LAST_LINE.match(M.last_line(s))
    assert m, M.last_line(s)
    assert m.group(1) == "3" and float(m.group(2)) == pytest.approx(5 / 6, abs=1e-3) and m.group(5) == "2"
    assert float(m.group(9)) == pytest.approx(M.pooled_auc([0.9, 0.5, 0.8, 0.4, 0.7], [0.1, 0.5, 0.0, 0.6, 0.2]),
                                              abs=1e-3)
    empty = M.summarise_kinds(rows[:3], EDIT_KINDS, resamples=10)  # no valid pairs: nan, still parses
    m = LAST_LINE.match(M.last_line(empty))
    assert m and m.group(5) == "0" and m.group(6) == "nan" and m.group(7) == "nan"


# ------------------------------------------------------------------------------------------------ pair building
ITEMS = {"q1": [EvidenceItem("Alpha", ("a.one",), ("alpha",)), EvidenceItem("Beta", ("b.two",), ("beta",))],
         "q2": [EvidenceItem("Gamma", ("c.three",), ("gamma",))]}
KNOWN = ("a.one", "b.two", "c.three", "d.four", "e.five")
GOOD = ("Alpha is what the module documents for this case [a.one]. Beta covers the other half of it [b.two].\n"
        "Conclusion: use alpha first, then beta.")
HALF = "Alpha is what the module documents for this case [a.one], and that is the main point.\nConclusion: alpha."
OTHER = "Gamma is the answer to a different question entirely [c.three].\nConclusion: gamma."


def _samples() -> list[Sample]:
    return [Sample("q1", "Question one?", GOOD, ("a.one", "b.two"), True, 0),
            Sample("q1", "Question one?", HALF, ("a.one",), True, 1),
            Sample("q1", "Question one?", "Uncited, so not grounded at all, whatever it says.", ("a.one",), False, 2),
            Sample("q1", "Question one?", None, (), False, 3),
            Sample("q2", "Question two?", OTHER, ("c.three",), True, 0)]


def _verifier(side, qid):
    """Grounded validity and item_recall recomputed from the verifier itself, not from the builder's record."""
    grounded = grounded_answer_valid(side.text, side.retrieved, 20)
    return grounded, item_recall(ITEMS[qid], side.text or "", side.retrieved, grounded)


def test_degraded_pairs_are_really_degraded_and_valid_pairs_differ_by_an_item():
    pairs, stats = build_pairs(_samples(), ITEMS, random.Random(0), max_degraded=100, max_valid=100, known_ids=KNOWN)
    assert stats.grounded_valid == 3 and stats.distinct_valid == 3
    degraded = [p for p in pairs if p.kind != VALID]
    # every grounded-valid report (GOOD, HALF, OTHER) gets every edit it can take
    assert {p.kind for p in degraded} == set(EDIT_KINDS)
    for p in degraded:
        good, bad = p.sides[p.better], p.sides[p.worse]
        assert good.edit == "original" and bad.edit == p.kind
        (g_ok, g_rec), (b_ok, b_rec) = _verifier(good, p.query_id), _verifier(bad, p.query_id)
        assert g_ok and b_ok <= g_ok and b_rec <= g_rec, p
        if p.kind in ("no_citation", "unretrieved_citation", "empty"):
            assert not b_ok
        if p.kind == "unretrieved_citation":
            swapped = set(re.findall(r"\[([^\]]+)\]", bad.text)) - set(good.retrieved)
            assert swapped and swapped <= set(KNOWN)  # a real corpus id its searches never returned
        if p.kind == "truncated":
            assert bad.words < good.words and "Conclusion:" not in bad.text
        if p.kind == "off_topic":
            assert bad.source_query != p.query_id and bad.text == (OTHER if p.query_id == "q1" else bad.text)
        assert (good.grounded_valid, good.item_recall) == (g_ok, g_rec)
    (valid,) = [p for p in pairs if p.kind == VALID]
    good, bad = valid.sides[valid.better], valid.sides[valid.worse]
    assert (good.text, bad.text) == (GOOD, HALF) and good.satisfied - bad.satisfied >= 1
    assert _verifier(good, "q1") == (True, 1.0) and _verifier(bad, "q1") == (True, 0.5)
    # the better side's position is drawn, and the build is deterministic for a seed
    again, _ = build_pairs(_samples(), ITEMS, random.Random(0), max_degraded=100, max_valid=100, known_ids=KNOWN)
    assert pairs == again and {p.better for p in pairs} == {0, 1}


def test_caps_and_edits_that_cannot_be_made():
    pairs, _ = build_pairs(_samples(), ITEMS, random.Random(1), max_degraded=3, max_valid=0, known_ids=KNOWN)
    assert len(pairs) == 3 and all(p.kind != VALID for p in pairs)
    # no corpus id outside what it retrieved: the unretrieved-citation edit is skipped and counted
    one = [Sample("q1", "Question one?", GOOD, ("a.one", "b.two"), True, 0)]
    pairs, stats = build_pairs(one, ITEMS, random.Random(0), max_degraded=10, max_valid=10,
                               known_ids=("a.one", "b.two"))
    assert stats.skipped["unretrieved_citation"] == 1 and stats.skipped["off_topic"] == 1  # no other query either
    assert sorted(p.kind for p in pairs) == ["empty", "no_citation", "truncated"]


# ------------------------------------------------------------------------------------------------ pair set
def test_pair_set_round_trip_keeps_its_digest_and_refuses_a_tampered_file(tmp_path):
    pairs, _ = build_pairs(_samples(), ITEMS, random.Random(0), max_degraded=100, max_valid=100, known_ids=KNOWN)
    path = tmp_path / "pairs.jsonl"
    digest = write_pair_set(path, pairs, {"seed": 0})
    back, manifest = read_pair_set(path)
    assert back == pairs and manifest["digest"] == digest and manifest["seed"] == 0
    assert manifest["pairs"] == len(pairs) - 1 and manifest["valid_pairs"] == 1
    assert write_pair_set(tmp_path / "again.jsonl", back) == digest  # stable across a write/read round trip
    assert pairs_text(back) == path.read_text(encoding="utf-8")
    path.write_text(path.read_text(encoding="utf-8").replace("Alpha is", "Alpha was", 1), encoding="utf-8")
    with pytest.raises(PairSetError, match="changed after it was written"):
        read_pair_set(path)
    manifest_path(tmp_path / "again.jsonl").unlink()
    with pytest.raises(PairSetError, match="no manifest"):
        read_pair_set(tmp_path / "again.jsonl")


# ------------------------------------------------------------------------------------------------ the evaluator
def test_evaluator_scores_go_through_the_step_and_agree_across_protocols(tokenizer, bm25):
    """The scripted evaluator scores a report by its citations (3 points each) and length (a point per 120
    characters of its part of the prompt, which runs to the prompt's end for the last report): the step's scoring
    stage must give each side that score under ``pointwise`` (each distinct report once) and under ``joint`` (a
    pair's two reports in one evaluation), up to that one length point."""
    from helpers import compose

    from score_lightning.evaluation.pair_scoring import evaluator_scores
    from score_lightning.rollout.scripted import ProtocolResponder, ScriptedEngine
    from score_lightning.step.rollouts import rollout_settings

    state = HarnessState()
    rubric = fallback_rubric(state)
    pairs, _ = build_pairs(_samples(), ITEMS, random.Random(0), max_degraded=100, max_valid=100, known_ids=KNOWN)
    rubrics = {q: rubric for q in ("q1", "q2")}
    out = {}
    for protocol in ("pointwise", "joint"):
        cfg = compose(["experiment=tiny_score", f"evaluator.scoring={protocol}", "evaluator.constrained_scoring=false"])
        engine = ScriptedEngine(tokenizer, ProtocolResponder())
        out[protocol] = evaluator_scores(engine, tokenizer, bm25, pairs, rubrics, state,
                                         rollout_settings(cfg.solver, cfg.evaluator), batch=8)
        assert out[protocol].failed == 0
    units = {(p.query_id, s.text, s.retrieved) for p in pairs for s in p.sides}
    assert out["pointwise"].judgements == len(units) and out["joint"].judgements == len(pairs)
    for p, a, b in zip(pairs, out["pointwise"].scores, out["joint"].scores):
        assert a[0] == pytest.approx(b[0], abs=0.11) and a[1] == pytest.approx(b[1], abs=0.11), p
        if p.kind in ("no_citation", "empty"):  # >= 1 citation against none: 3 points, more than length gives
            assert a[p.better] > a[p.worse] + 0.15 and b[p.better] > b[p.worse] + 0.15


# ------------------------------------------------------------------------------------------------ external judge
def _evaluation(dims, value: int) -> str:
    scores = "".join(f'<score dim="{d}" value="{value}" reason="r"/>' for d in dims)
    return (f'{P.EVALS_OPEN}<report id="1">{P.VERIFICATION_OPEN}checked{P.VERIFICATION_CLOSE}'
            f"{P.GAP_OPEN}none{P.GAP_CLOSE}{P.SCORES_OPEN}{scores}{P.SCORES_CLOSE}{P.REPORT_CLOSE}{P.EVALS_CLOSE}")


def test_external_judge_scores_both_sides_and_a_failed_judgement_leaves_its_pairs_out():
    state = HarnessState()
    rubric = fallback_rubric(state)
    pairs, _ = build_pairs(_samples(), ITEMS, random.Random(0), max_degraded=100, max_valid=100, known_ids=KNOWN)
    # the judge: 8 for a report with a citation, 2 without; the truncated report's request fails (HTTP 400), and
    # the first reply on GOOD's uncited edit is a search (no evaluation): re-asked once, then scored
    truncated = next(p.sides[p.worse].text for p in pairs if p.kind == "truncated" and p.query_id == "q1")
    nocite = next(p.sides[p.worse].text for p in pairs if p.kind == "no_citation" and p.sides[p.better].text == GOOD)

    def reply(request):
        msgs = request["messages"]
        body = msgs[1]["content"].split("[Report 1]\n", 1)[1]
        body = re.sub(r"^Retrieved by its searches:.*\n", "", body).strip()
        if body == truncated.strip():
            return Reply(status=400)
        if body == nocite.strip() and len(msgs) == 2:
            return f"{P.SEARCH_OPEN}verify the claims{P.SEARCH_CLOSE}"
        return _evaluation(rubric.dims, 8 if re.search(r"\[[a-z]+\.[a-z]+\]", body) else 2)

    with OpenAIStub(content=reply) as stub:
        client = ChatClient(stub.base_url, "stub-model", timeout_s=10, max_retries=1)
        rubrics = {q: rubric for q in ("q1", "q2")}
        out = judge_scores(client, pairs, rubrics, state, "pointwise", show_retrieved=True, concurrency=3)
        requests = stub.chat_requests
    units = {(p.query_id, s.text, s.retrieved) for p in pairs for s in p.sides}
    # one request each (a 400 is not retried), one more for the re-asked search
    assert out.judgements == len(units) and len(requests) == len(units) + 1
    assert out.failed == 1 and dict(out.errors) == {"http_400": 1}
    (reasked,) = [r for r in requests if len(r.json["messages"]) == 4]
    assert "<report_evaluations> block" in reasked.json["messages"][-1]["content"]
    assert "Retrieved by its searches" in requests[0].json["messages"][-1]["content"]  # evaluator.show_retrieved
    left_out = [p for p, s in zip(pairs, out.scores) if None in s]
    assert [(p.kind, p.query_id) for p in left_out] == [("truncated", "q1")]  # never scored 0
    for p, s in zip(pairs, out.scores):
        if p.kind in ("no_citation", "empty") and None not in s:
            assert s[p.better] == pytest.approx(0.8) and s[p.worse] == pytest.approx(0.2)


# ------------------------------------------------------------------------------------------------ end to end
def test_the_script_builds_stores_and_scores_a_pair_set(tmp_path, tiny_ckpt, bm25):
    """The scripted engine's reports cite what they retrieved (variant 0 long, 1 short, 2 uncited), so with items
    that the long report satisfies ("caveats" and its first retrieved id) there are degraded and valid pairs."""
    from score_lightning.data.queries import load_queries

    items = tmp_path / "items.jsonl"
    with items.open("w") as f:
        for q in load_queries(None, "heldout")[:3]:
            words = " ".join(re.findall(r"[A-Za-z_.]+", q.prompt)[:4])
            hits = [h.id for h in bm25.search([words], 5)[0]]
            f.write(json.dumps({"id": q.id, "prompt": q.prompt, "split": "heldout", "rubrics": [
                {"text": "Names the caveats", "weight": 1.0, "type": "binary", "evidence": hits,
                 "terms": ["caveats"]}]}) + "\n")
    common = ["--seed", "3", "--resamples", "100", "experiment=tiny_score", "sft.enabled=false", "rollout=scripted",
              "threads.num=1", "solver.max_tool_calls=1", "evaluator.max_tool_calls=1", f"reward.items_path={items}"]
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "scripts/bench_evaluator.py", "--queries", "3", "--samples", "3",
                           "--pairs", "8", "--out", str(out), *common], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    m = LAST_LINE.match(lines[-1])
    assert m, lines[-1]
    assert int(m.group(1)) == 8 and int(m.group(5)) == 3  # one valid pair per query: long vs short report
    assert float(m.group(6)) == 1.0  # the script scores a report by its citations and length
    assert 0.0 <= float(m.group(2)) <= 1.0 and 0.0 <= float(m.group(9)) <= 1.0
    pairs, manifest = read_pair_set(out / "pairs.jsonl")
    assert len(pairs) == 11 and manifest["samples"] == 3 and manifest["queries_with_items"] == 3
    digest_line = next(line for line in lines if line.startswith("pair_set="))
    assert manifest["digest"] in digest_line
    (result,) = out.glob("results-evaluator-seed3-*.json")
    record = json.loads(result.read_text())
    assert record["pair_set_digest"] == manifest["digest"] and record["last_line"] == lines[-1]
    assert record["summary"]["valid"]["pairs"] == 3 and len(record["scores"]) == 11
    # a stored set is scored again as it was (nothing sampled): the same digest, the same last line
    again = subprocess.run([sys.executable, "scripts/bench_evaluator.py", "--pair-set", str(out / "pairs.jsonl"),
                            *common], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert again.stdout.strip().splitlines()[-1] == lines[-1]
    assert f"digest={manifest['digest']}" in again.stdout and "sampled" not in again.stdout
