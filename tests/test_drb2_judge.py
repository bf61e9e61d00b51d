"""DeepResearch Bench II rubric judging against a real loopback chat-completions server.

The sample ``tests/data/drb2/`` is hand-written in DRB-II's published ``tasks_and_rubrics.jsonl``
format (github.com/imlrz/DeepResearch-Bench-II): three tasks, one in Chinese, one without a
``blocked`` source, one item listed twice. The stub judge scores each item from ``SCORES`` and fails
every request that holds task55's analysis item, so the aggregation is checked by hand below.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from openai_stub import OpenAIStub, Reply

from score_lightning.data.queries import load_queries
from score_lightning.evaluation import main
from score_lightning.evaluation.drb2_judge import Drb2Options, run_drb2
from score_lightning.evaluation.drb2_prompt import batch_messages, normalise_item, parse_batch_reply
from score_lightning.data.drb2_tasks import load_drb2_tasks
from score_lightning.evaluation.judge import JudgeClient, read_jsonl
from score_lightning.evaluation.report_card import render_markdown, summarise, write_report

DATA = Path(__file__).resolve().parent / "data" / "drb2"
TASKS = DATA / "tasks_and_rubrics.jsonl"
ARTICLES = DATA / "articles.jsonl"

_T = {t.id: t for t in load_drb2_tasks(TASKS).values()}
A, B, C = _T["task101"], _T["task12+"], _T["task55"]
SCORES = {
    # task101: info_recall 1, 0, 1 -> 2/3; analysis (distinct) 1, -1 -> 1/2; presentation 1 -> 1
    **dict(zip(A.rubric["info_recall"], (1, 0, 1))), **dict(zip(A.rubric["analysis"][:2], (1, -1))),
    A.rubric["presentation"][0]: 1,
    # task12+: info_recall 1, 1 -> 1; analysis 0, 0 -> 0; presentation 0 -> 0
    **dict(zip(B.rubric["info_recall"], (1, 1))), **dict(zip(B.rubric["analysis"], (0, 0))),
    B.rubric["presentation"][0]: 0,
    # task55: the batch with its analysis item always fails; info_recall 1, 0 would be judged
    **dict(zip(C.rubric["info_recall"], (1, 0))),
}
FAILING = C.rubric["analysis"][0]


def rubric_items(req: dict) -> list[str]:
    text = req["messages"][0]["content"]
    block = text.split("<task_and_rubric>\n", 1)[1].split("\n</task_and_rubric>", 1)[0]
    return json.loads(block)["rubric_items"]


def judge(req: dict):
    """Scores per item; a different reply form per task, as real judges vary."""
    items = rubric_items(req)
    if FAILING in items:
        return Reply(status=500)
    results = [{"rubric_item": it, "score": SCORES[it], "reason": "r", "evidence": "" if SCORES[it] == 0 else "e"}
               for it in items]
    if items[0] in B.items():  # Chinese task: a bare list, scores as strings, items re-spaced
        return json.dumps([{**r, "score": str(r["score"]), "rubric_item": " " + r["rubric_item"] + " "}
                           for r in results], ensure_ascii=False)
    return "Here is my assessment.\n```json\n" + json.dumps({"results": results}, ensure_ascii=False) + "\n```"


@pytest.fixture
def stub():
    with OpenAIStub(content=judge) as s:
        yield s


def client(stub, **kw) -> JudgeClient:
    kw.setdefault("timeout_s", 5.0)
    kw.setdefault("max_retries", 0)
    return JudgeClient(stub.base_url, "judge-x", "sk-test", **kw)


def test_the_sample_is_in_drb2s_format_and_generate_reads_it_as_queries():
    assert [(t.id, t.idx, t.language) for t in _T.values()] == [("task101", 1, "en"), ("task12+", 2, "zh"),
                                                              ("task55", 3, "en")]
    assert C.blocked == {} and A.blocked["title"] == "Urban Heat Islands in Europe: A Review"
    assert len(A.items()) == 7 and A.distinct("analysis") == list(A.rubric["analysis"][:2])
    assert [q.id for q in load_queries(TASKS)] == ["task101", "task12+", "task55"]


def test_scores_aggregate_as_drb2_by_hand_and_a_failed_batch_is_missing_not_zero(stub, tmp_path):
    arts = read_jsonl(ARTICLES)
    recs = run_drb2(arts, load_drb2_tasks(TASKS), client(stub), Drb2Options(chunk_size=2, concurrency=3))
    # batches of 2 items in DRB-II's order, crossing dimensions: 4 + 3 + 2 requests
    sent = sorted((tuple(rubric_items(r.json)) for r in stub.chat_requests), key=lambda b: A.items().index(b[0])
                  if b[0] in A.items() else 100 + (B.items() + C.items()).index(b[0]))
    assert sent == [tuple(A.items()[i:i + 2]) for i in (0, 2, 4, 6)] + [
        tuple(B.items()[i:i + 2]) for i in (0, 2, 4)] + [tuple(C.items()[:2]), tuple(C.items()[2:])]
    a, b, c = recs
    assert a["scores"] == pytest.approx({"info_recall": 2 / 3, "analysis": 1 / 2, "presentation": 1.0,
                                         "total": 4 / 6, "blocked_rate": 1 / 6})
    assert b["scores"] == {"info_recall": 1.0, "analysis": 0.0, "presentation": 0.0, "total": 0.4,
                           "blocked_rate": 0.0}
    assert c["scores"] is None and c["error"] == "http_500" and c["missing_items"] == 2
    assert [it["score"] for it in c["items"]["info_recall"]] == [1, 0]  # the answered batch is kept
    assert [bt["error"] for bt in sorted(c["batches"], key=lambda x: x["batch"])] == [None, "http_500"]

    s = summarise([{"id": r["article_id"], "drb2": r} for r in recs], {"drb2": {"tasks": 3}})["drb2"]
    sc = s["scores"]
    # means over the two scored articles; task55 is left out (with it as 0 info_recall would be 5/9)
    assert sc["info_recall"] == {"mean": pytest.approx(5 / 6), "stderr": pytest.approx(1 / 6), "n": 2, "missing": 1}
    assert sc["analysis"] == {"mean": pytest.approx(1 / 4), "stderr": pytest.approx(1 / 4), "n": 2, "missing": 1}
    assert sc["presentation"] == {"mean": 0.5, "stderr": pytest.approx(0.5), "n": 2, "missing": 1}
    assert sc["total"]["mean"] == pytest.approx(8 / 15) and sc["total"]["stderr"] == pytest.approx(2 / 15)
    assert sc["blocked_rate"]["mean"] == pytest.approx(1 / 12) and sc["blocked_rate"]["missing"] == 1
    assert s["items"] == {"total": 15, "satisfied": 7, "not_mentioned": 5, "blocked": 1, "missing": 2}
    assert (s["matched"], s["scored"], s["missing"], s["missing_by_error"]) == (3, 2, 1, {"http_500": 1})
    assert s["tasks_without_article"] == 0
    assert s["total_by_language"] == {"en": {"mean": pytest.approx(2 / 3), "stderr": None, "n": 1},
                                      "zh": {"mean": pytest.approx(0.4), "stderr": None, "n": 1}}


def test_an_unparseable_reply_is_reasked_then_missing(stub, tmp_path):
    arts = [a for a in read_jsonl(ARTICLES) if a["id"] == "task12+"]
    stub.content = lambda req: json.dumps({"results": [{"rubric_item": rubric_items(req)[0], "score": 1}]})
    recs = run_drb2(arts, load_drb2_tasks(TASKS), client(stub, max_retries=1), Drb2Options())
    assert len(stub.chat_requests) == 2  # one batch (chunk 50), asked twice
    assert "4 of 5 rubric items unanswered" in stub.chat_requests[1].json["messages"][-1]["content"]
    (r,) = recs
    assert r["scores"] is None and r["error"] == "unparseable" and r["missing_items"] == 5
    s = summarise([{"id": "task12+", "drb2": r}])["drb2"]
    assert s["scores"]["total"] == {"mean": None, "stderr": None, "n": 0, "missing": 1}


def test_the_request_carries_passage_task_items_and_blocked_source(stub):
    task = A
    (msg,) = batch_messages(task, task.items()[:2], "Report text.")
    assert msg["role"] == "user"
    body = msg["content"]
    assert "<passage>\nReport text.\n</passage>" in body
    sent = json.loads(body.split("<task_and_rubric>\n")[1].split("\n</task_and_rubric>")[0])
    assert sent == {"task": task.task, "rubric_items": task.items()[:2], "blocked": task.blocked}
    zh = json.dumps({"rubric_items": B.items()}, ensure_ascii=False)[20:40]
    assert zh in batch_messages(B, B.items(), "x")[0]["content"]  # Chinese sent as is, not \u-escaped


def test_reply_parsing_is_tolerant_of_form_strict_on_content():
    items = ["States that X rose to 5 %.", "明确指出‘土地财政’的定义。"]
    ok = {"results": [{"rubric_item": "states that x rose to 5 %", "score": 1.0, "evidence": ["a", "b"]},
                      {"rubric_item": "明确指出'土地财政'的定义。", "score": "-1", "reason": "cites it"}]}
    got = parse_batch_reply("<think>hmm {</think>Sure: " + json.dumps(ok, ensure_ascii=False), items)
    assert got[items[0]] == {"score": 1, "reason": "", "evidence": "a\nb"}
    assert got[items[1]]["score"] == -1
    by_position = [{"rubric_item": "paraphrased one", "score": 0}, {"rubric_item": items[1], "score": 1}]
    assert parse_batch_reply(json.dumps(by_position), items)[items[0]]["matched_by_position"]
    extra = {"results": [*ok["results"], {"rubric_item": "not asked", "score": 7}]}
    assert set(parse_batch_reply(json.dumps(extra), items)) == set(items)
    for bad in ("", "no json", json.dumps({"results": ok["results"][:1]}),
                json.dumps({"results": [{**ok["results"][0], "score": 2}, ok["results"][1]]}),
                json.dumps({"results": [{**ok["results"][0], "score": True}, ok["results"][1]]}),
                json.dumps({"results": [{"rubric_item": items[0]}, ok["results"][1]]})):
        with pytest.raises(ValueError):
            parse_batch_reply(bad, items)
    assert normalise_item(" “Quoted”  Text. ") == '"quoted" text'


@pytest.mark.parametrize("edit, message", [
    (lambda line: line[:-3], "invalid JSON"),
    (lambda line: line.replace('"idx": 2', '"idx": "2"'), '"idx" must be an integer'),
    (lambda line: line.replace('"presentation"', '"style"'), "unknown dimension(s) ['style']"),
    (lambda line: line.replace('"analysis": [', '"analysis": [3, '), '"content.rubric.analysis[0]" must be a non-empty'),
    (lambda line: line.replace('"urls": [', '"urls": [1, '), '"content.blocked.urls" must be a list of strings'),
    (lambda line: line.replace('"task12+"', '"task101"'), "duplicate id 'task101' (first on line 1)"),
    (lambda line: line.replace(', "prompt": ', ', "prompt_": '), 'missing field "prompt"'),
])
def test_a_malformed_task_line_names_file_and_line(tmp_path, edit, message):
    lines = TASKS.read_text(encoding="utf-8").splitlines()
    lines[1] = edit(lines[1])
    bad = tmp_path / "tasks.jsonl"
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ValueError) as err:
        load_drb2_tasks(bad)
    assert str(err.value).startswith(f"{bad}:2: ") and message in str(err.value)


def test_cli_judge_drb2_writes_the_files(stub, tmp_path, capsys):
    arts = tmp_path / "model-x.jsonl"
    shutil.copy(ARTICLES, arts)
    with arts.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps({"id": "not-a-task", "prompt": "p", "article": "a"}) + "\n")
    rc = main(["judge", "--articles", str(arts), "--drb2-tasks", str(TASKS), "--no-quality", "--no-citations",
               "--judge-base-url", stub.base_url, "--judge-model", "m", "--max-retries", "0",
               "--drb2-timeout-s", "5", "--no-progress"])
    assert rc == 0
    out = tmp_path / "model-x.judge"
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    d = summary["drb2"]
    assert len(stub.chat_requests) == 3 and summary["meta"]["requests_sent"] == 3  # one batch of <= 50 per task
    assert (d["matched"], d["unmatched"], d["unmatched_ids"], d["scored"], d["missing"]) == (3, 1, ["not-a-task"], 2, 1)
    assert d["items"]["missing"] == 4  # task55's one batch failed: all 4 of its items
    assert d["scores"]["total"]["mean"] == pytest.approx(8 / 15)
    assert summary["meta"]["drb2"]["chunk_size"] == 50 and summary["meta"]["drb2"]["tasks"] == 3
    card = (out / "report_card.md").read_text(encoding="utf-8")
    assert "## DeepResearch Bench II rubrics" in card and "comprehensiveness" not in card
    assert "| information recall | 0.833 ± 0.167 | 2 | 1 |" in card
    assert "| total (all items) | 0.533 ± 0.133 | 2 | 1 |" in card and "http_500 1" in card
    judged = [json.loads(line) for line in (out / "judgments.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [j["drb2"]["task_id"] for j in judged] == ["task101", "task12+", "task55", None]
    results = [json.loads(line) for line in (out / "drb2_results.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [(r["model"], r["idx"]) for r in results] == [("model-x", 1), ("model-x", 2), ("model-x", 3)]
    assert results[0]["result"]["task"] == A.task and "error" in results[2]["result"]
    assert results[1]["result"]["scores"]["info_recall"][B.rubric["info_recall"][0]]["score"] == 1
    assert len(results[0]["result"]["scores"]["analysis"]) == 2  # the repeated item counts once
    assert "| information recall | 0.833 ± 0.167 | 2 | 1 |" in capsys.readouterr().out


def test_cli_refuses_a_bad_tasks_file_before_any_request(stub, tmp_path, capsys):
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"id": "x"}\n', encoding="utf-8")
    rc = main(["judge", "--articles", str(ARTICLES), "--drb2-tasks", str(bad), "--no-quality", "--no-citations",
               "--judge-base-url", stub.base_url, "--judge-model", "m", "--out-dir", str(tmp_path / "o")])
    assert rc == 2 and f"{bad}:1: " in capsys.readouterr().err and not stub.chat_requests


def test_no_matching_article_is_an_error_and_quality_sections_stay(stub, tmp_path):
    arts = [{"id": 7, "prompt": "p", "article": "a"}]
    with pytest.raises(ValueError, match="no article id matches"):
        run_drb2(arts, load_drb2_tasks(TASKS), client(stub))
    recs = [{"id": 1, "quality": None, "quality_error": "timeout", "citations": [],
             "drb2": {"article_id": 1, "task_id": None, "scores": None, "error": "no_drb2_task"}}]
    card = render_markdown(write_report(tmp_path, recs, {"drb2": {"tasks": 3}}))
    assert "| comprehensiveness (0–10) | n/a | 0 | 1 |" in card and "1 articles match no task id" in card


def test_cli_runs_the_quality_judge_and_the_rubrics_together(stub, tmp_path):
    quality = json.dumps({d: {"score": 6, "reason": "r"} for d in
                          ("comprehensiveness", "insight", "instruction_following", "readability")})
    stub.content = lambda req: quality if req["messages"][0]["role"] == "system" else judge(req)
    rc = main(["judge", "--articles", str(ARTICLES), "--drb2-tasks", str(TASKS), "--no-citations", "--limit", "2",
               "--judge-base-url", stub.base_url, "--judge-model", "m", "--max-retries", "0",
               "--out-dir", str(tmp_path / "o"), "--no-progress"])
    assert rc == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text(encoding="utf-8"))
    assert summary["quality"]["insight"] == {"mean": 6.0, "stderr": 0.0, "n": 2, "missing": 0}
    assert summary["drb2"]["scores"]["total"]["mean"] == pytest.approx(8 / 15) and summary["drb2"]["matched"] == 2
    assert summary["meta"]["requests_sent"] == 4 and summary["drb2"]["tasks_without_article"] == 1
    card = (tmp_path / "o" / "report_card.md").read_text(encoding="utf-8")
    assert "| insight (0–10) | 6.00 ± 0.00 | 2 | 0 |" in card and "## DeepResearch Bench II rubrics" in card
