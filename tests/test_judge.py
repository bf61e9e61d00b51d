"""The LLM judge against a real loopback chat-completions server: valid, malformed and failing replies,
citation verdicts, and the report-card arithmetic checked by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from openai_stub import OpenAIStub, Reply

from score_lightning.evaluation import main
from score_lightning.evaluation.judge import (
    QUALITY_DIMENSIONS,
    JudgeClient,
    JudgeOptions,
    cited_statements,
    parse_quality_reply,
    run_judge,
    split_statements,
)
from score_lightning.evaluation.report_card import mean_stderr, render_markdown, summarise, write_report


def quality_json(scores: dict[str, float] | float) -> str:
    if not isinstance(scores, dict):
        scores = {d: scores for d in QUALITY_DIMENSIONS}
    return json.dumps({d: {"score": s, "reason": f"{d} reason"} for d, s in scores.items()})


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def is_quality(req: dict) -> bool:
    return "reviewer of deep-research reports" in req["messages"][0]["content"]


def user_text(req: dict) -> str:
    return req["messages"][1]["content"]


@pytest.fixture
def stub():
    with OpenAIStub() as s:
        yield s


def client(stub, **kw) -> JudgeClient:
    kw.setdefault("timeout_s", 5.0)
    return JudgeClient(stub.base_url, "judge-x", "sk-test", **kw)


def articles_file(tmp_path: Path, texts: list[str]) -> Path:
    return write_jsonl(tmp_path / "a.jsonl", [{"id": i + 1, "prompt": f"task {i + 1}", "article": t}
                                             for i, t in enumerate(texts)])


def test_quality_scores_and_summary_arithmetic(stub, tmp_path):
    # article 1 gets comprehensiveness 6, insight 5; article 2 gets 8 and 9
    per_article = {"alpha": {"comprehensiveness": 6, "insight": 5, "instruction_following": 10, "readability": 7},
                   "beta": {"comprehensiveness": 8, "insight": 9, "instruction_following": 10, "readability": 7}}
    stub.content = lambda req: quality_json(per_article["alpha" if "alpha" in user_text(req) else "beta"])
    arts = articles_file(tmp_path, ["alpha report", "beta report"])
    recs = run_judge(arts, None, client(stub), JudgeOptions(citations=False))
    summary = write_report(tmp_path / "out", recs, {"judge_model": "judge-x"})

    q = summary["quality"]
    assert q["comprehensiveness"] == {"mean": 7.0, "stderr": pytest.approx(1.0), "n": 2, "missing": 0}
    # insight: mean 7, std(ddof=1) = sqrt(8) -> s.e. = sqrt(8)/sqrt(2) = 2
    assert q["insight"]["mean"] == 7.0 and q["insight"]["stderr"] == pytest.approx(2.0)
    assert q["instruction_following"]["stderr"] == 0.0 and q["readability"]["mean"] == 7.0
    assert recs[0]["quality"]["insight"] == {"score": 5.0, "reason": "insight reason"}
    card = (tmp_path / "out" / "report_card.md").read_text()
    assert "| comprehensiveness (0–10) | 7.00 ± 1.00 | 2 | 0 |" in card
    assert "| insight (0–10) | 7.00 ± 2.00 | 2 | 0 |" in card
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["quality"]["insight"]["n"] == 2
    assert len((tmp_path / "out" / "judgments.jsonl").read_text().splitlines()) == 2
    # the request: chat-completions protocol, model, key, task and article in the prompt
    r = stub.chat_requests[0]
    assert r.json["model"] == "judge-x" and r.header("Authorization") == "Bearer sk-test"
    assert r.json["messages"][0]["role"] == "system" and "task" in user_text(r.json)


def test_malformed_reply_retried_then_missing_not_zero(stub, tmp_path):
    stub.content = quality_json(8)
    # article 1: three bad replies (1 try + 2 retries); article 2: the valid default
    stub.script("not json at all", json.dumps({"comprehensiveness": 3}), quality_json(11))
    arts = articles_file(tmp_path, ["first", "second"])
    recs = run_judge(arts, None, client(stub, max_retries=2), JudgeOptions(citations=False, concurrency=1))
    assert len(stub.chat_requests) == 4
    assert recs[0]["quality"] is None and recs[0]["quality_error"] == "unparseable" and recs[0]["quality_attempts"] == 3
    s = summarise(recs)
    for dim in QUALITY_DIMENSIONS:
        assert s["quality"][dim] == {"mean": 8.0, "stderr": None, "n": 1, "missing": 1}  # not (0 + 8) / 2
    assert s["quality_missing_by_error"] == {"unparseable": 1}
    card = render_markdown(s)
    assert "| readability (0–10) | 8.00 ± n/a | 1 | 1 |" in card and "quality/unparseable 1" in card


def test_recovers_after_one_bad_reply(stub, tmp_path):
    stub.content = quality_json(4)
    stub.script(Reply(status=503), "```json\n" + quality_json(6) + "\n```")
    recs = run_judge(articles_file(tmp_path, ["x"]), None, client(stub, max_retries=2), JudgeOptions(citations=False))
    assert recs[0]["quality"]["readability"]["score"] == 6.0 and recs[0]["quality_attempts"] == 2
    first, second = stub.chat_requests  # the SDK resent the same request after the 503
    assert second.json == first.json and second.header("x-stainless-retry-count") == "1"


def test_truncated_reply_is_reasked_then_missing(stub, tmp_path):
    """finish_reason "length": the JSON may be cut anywhere, so the reply is not scored even if it parses."""
    stub.content = quality_json(8)
    stub.script(Reply(content=quality_json(3), finish_reason="length"), quality_json(8),  # article 1: cut, then fine
                Reply(content="{", finish_reason="length"), Reply(content="{", finish_reason="length"))  # article 2
    arts = articles_file(tmp_path, ["one", "two"])
    recs = run_judge(arts, None, client(stub, max_retries=1, max_tokens=64), JudgeOptions(citations=False, concurrency=1))
    assert recs[0]["quality"]["insight"]["score"] == 8.0 and recs[0]["quality_attempts"] == 2
    assert recs[1]["quality"] is None and recs[1]["quality_error"] == "truncated"
    retry = stub.chat_requests[1].json["messages"]
    assert retry[2] == {"role": "assistant", "content": quality_json(3)}
    assert "reply truncated at max_tokens (64)" in retry[3]["content"]
    assert summarise(recs)["quality_missing_by_error"] == {"truncated": 1}


def test_http_errors_and_timeouts_are_missing_and_counted(stub, tmp_path):
    stub.content = quality_json(5)
    stub.script(Reply(status=500), Reply(status=500),               # article 1: 500 twice -> missing
                Reply(delay_s=1.0), Reply(delay_s=1.0),             # article 2: timeout twice -> missing
                Reply(status=401))                                  # article 3: 401, not retried -> missing
    arts = articles_file(tmp_path, ["a", "b", "c", "d"])            # article 4: valid default
    recs = run_judge(arts, None, client(stub, max_retries=1, timeout_s=0.3), JudgeOptions(citations=False, concurrency=1))
    assert [r["quality_error"] for r in recs] == ["http_500", "timeout", "http_401", None]
    assert [r["quality_attempts"] for r in recs] == [2, 2, 1, 1]
    s = summarise(recs)
    assert s["quality"]["insight"] == {"mean": 5.0, "stderr": None, "n": 1, "missing": 3}
    assert s["quality_missing_by_error"] == {"http_401": 1, "http_500": 1, "timeout": 1}


CITED_ARTICLE = (
    "Intro without citations.\n"
    "Alpha holds for every input [doc_a]. Beta is false [doc_b].\n"
    "Gamma is unclear. [doc_c]\n"                      # a citation after the period belongs to Gamma
    "Delta was made up [doc_never]. Epsilon breaks the judge [doc_e]."
)
SOURCES = {
    "id": 1,
    "citations": [
        {"doc_id": "doc_a", "retrieved": True, "title": "A", "text": "Alpha holds for every input."},
        {"doc_id": "doc_b", "retrieved": True, "title": "B", "text": "Beta is true."},
        {"doc_id": "doc_c", "retrieved": True, "title": "C", "text": "(garbled)"},
        {"doc_id": "doc_never", "retrieved": False, "title": None, "text": None},
        {"doc_id": "doc_e", "retrieved": True, "title": "E", "text": "Epsilon."},
    ],
    "retrieved_ids": ["doc_a", "doc_b", "doc_c", "doc_e"],
}


def citation_judge(req: dict) -> str:
    if is_quality(req):
        return quality_json(7)
    text = user_text(req)
    if "Epsilon" in text:
        return "I cannot answer in JSON today"
    verdict = {"Alpha": "supported", "Beta": "unsupported", "Gamma": "unknown"}[next(
        k for k in ("Alpha", "Beta", "Gamma") if k in text)]
    return json.dumps({"verdict": verdict.upper() if verdict == "supported" else verdict, "reason": "r"})


def test_citation_verdicts_and_valid_citation_ratio(stub, tmp_path):
    stub.content = citation_judge
    arts = articles_file(tmp_path, [CITED_ARTICLE])
    src = write_jsonl(tmp_path / "a.jsonl.sources.jsonl", [SOURCES])
    recs = run_judge(arts, src, client(stub, max_retries=1), JudgeOptions(quality=False, concurrency=2))
    by_doc = {c["doc_id"]: c for c in recs[0]["citations"]}
    assert {d: c["verdict"] for d, c in by_doc.items()} == {
        "doc_a": "supported", "doc_b": "unsupported", "doc_c": "unknown", "doc_never": "unsupported", "doc_e": None}
    assert by_doc["doc_never"]["never_retrieved"] and not by_doc["doc_never"]["judged"]
    assert by_doc["doc_e"]["error"] == "unparseable"
    assert by_doc["doc_c"]["statement"] == "Gamma is unclear. [doc_c]"
    # the never-retrieved citation costs no request: a, b, c once each, e twice (1 retry)
    sent = [user_text(r.json) for r in stub.chat_requests]
    assert len(sent) == 5 and not any("Delta" in t for t in sent)
    alpha = next(t for t in sent if "Alpha" in t)  # markers stripped, retrieved source text sent
    assert "[doc_a]" not in alpha and "<statement>\nAlpha holds for every input.\n</statement>" in alpha
    assert '<source id="doc_a: A">\nAlpha holds for every input.\n</source>' in alpha
    c = summarise(recs)["citations"]
    assert (c["total"], c["supported"], c["unsupported"], c["never_retrieved"], c["unknown"], c["missing"]) == (5, 1, 2, 1, 1, 1)
    assert c["valid_citation_ratio"] == pytest.approx(1 / 3)          # supported / (supported + unsupported)
    assert c["valid_citation_ratio_strict"] == pytest.approx(1 / 4)   # unknown counted as invalid
    assert c["missing_by_error"] == {"unparseable": 1}
    assert c["per_article"] == {"mean": pytest.approx(1 / 3), "stderr": None, "n": 1}
    assert "| valid-citation ratio (pooled) | 0.333 | 3 citations | 1 |" in render_markdown(summarise(recs))


def test_article_without_sources_entry_is_missing_not_unsupported(stub, tmp_path):
    stub.content = citation_judge
    arts = articles_file(tmp_path, ["Alpha holds for every input [doc_a].", "Beta is false [doc_b]."])
    src = write_jsonl(tmp_path / "s.jsonl", [{**SOURCES, "id": 2}])  # no entry for article 1
    recs = run_judge(arts, src, client(stub), JudgeOptions(quality=False))
    c = summarise(recs)["citations"]
    assert (c["supported"], c["unsupported"], c["missing"], c["articles_without_sources"]) == (0, 1, 1, 1)
    assert c["missing_by_error"] == {"no_sources_entry": 1} and c["valid_citation_ratio"] == 0.0


def test_sampled_sources_judge_the_article_files_sample_0(stub, tmp_path):
    """``generate --samples N`` writes N sources records per id after the article (sample 0): the judge
    must check the article's citations against sample 0's retrieved passages, not the last sample's."""
    stub.content = citation_judge
    arts = articles_file(tmp_path, ["Alpha holds for every input [doc_a]."])
    other = {"id": 1, "sample": 1, "citations": [], "retrieved_ids": []}
    src = write_jsonl(tmp_path / "s.jsonl", [{**SOURCES, "sample": 0}, other])
    recs = run_judge(arts, src, client(stub), JudgeOptions(quality=False))
    assert [(c["doc_id"], c["verdict"], c.get("never_retrieved", False)) for c in recs[0]["citations"]] == [
        ("doc_a", "supported", False)]


def test_statement_splitting_and_reply_parsing():
    assert split_statements("A is b [x]. [y]\nC.  D [z]!") == ["A is b [x]. [y]", "C.", "D [z]!"]
    assert cited_statements("A [x] [x]. B [y].") == [("A [x] [x].", "x"), ("B [y].", "y")]
    assert parse_quality_reply("Sure:\n```json\n" + quality_json(3) + "\n```")["insight"]["score"] == 3.0
    assert parse_quality_reply(json.dumps({"scores": {"Comprehensiveness": 1, "insight": "2", "instruction following": 3,
                                                       "readability": {"score": 4}}}))["readability"]["score"] == 4.0
    for bad in ("", "{}", quality_json(-1), quality_json(float("nan")).replace("NaN", '"x"'),
                json.dumps({d: True for d in QUALITY_DIMENSIONS})):
        with pytest.raises(ValueError):
            parse_quality_reply(bad)
    assert mean_stderr([]) == (None, None) and mean_stderr([4.0]) == (4.0, None)
    m, se = mean_stderr([6.0, 8.0])
    assert m == 7.0 and se == pytest.approx(1.0)
    m, se = mean_stderr([1.0, 2.0, 6.0])  # mean 3, var = (4+1+9)/2 = 7 -> se = sqrt(7/3)
    assert m == 3.0 and se == pytest.approx(math.sqrt(7 / 3))


def test_cli_judge_writes_summary_and_card(stub, tmp_path, monkeypatch, capsys):
    stub.content = citation_judge
    arts = articles_file(tmp_path, ["Alpha holds for every input [doc_a]."])
    write_jsonl(tmp_path / "a.jsonl.sources.jsonl", [SOURCES])
    monkeypatch.setenv("MY_JUDGE_KEY", "sk-cli")
    rc = main(["judge", "--articles", str(arts), "--judge-base-url", stub.base_url, "--judge-model", "m",
               "--api-key-env", "MY_JUDGE_KEY", "--max-retries", "0", "--timeout-s", "5", "--no-progress"])
    assert rc == 0
    out = tmp_path / "a.judge"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["quality"]["insight"]["mean"] == 7.0 and summary["citations"]["valid_citation_ratio"] == 1.0
    assert summary["meta"]["requests_sent"] == 2 and (out / "report_card.md").exists()
    assert all(r.header("Authorization") == "Bearer sk-cli" for r in stub.chat_requests)
    assert "| insight (0–10) | 7.00 ± n/a | 1 | 0 |" in capsys.readouterr().out
