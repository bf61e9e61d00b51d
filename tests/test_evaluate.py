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


class SearchOnce:
    """Retriever returning json.dumps for every search, so a citation of [json.dumps] is grounded."""

    def search(self, queries, topk):
        return OneDocRetriever().search(queries, topk)


def _sampled_scripts(n_rounds: int = 1) -> dict[str, list[str]]:
    """Three samples of one query per round: a search each, then a grounded, an ungrounded and an uncited answer."""
    search = f"{P.SEARCH_OPEN}json dumps{P.SEARCH_CLOSE}"
    answers = [f"{P.ANSWER_OPEN}json.dumps escapes non-ASCII text by default [json.dumps].{P.ANSWER_CLOSE}",
               f"{P.ANSWER_OPEN}json.dumps escapes non-ASCII text by default [never.seen].{P.ANSWER_CLOSE}",
               f"{P.ANSWER_OPEN}json.dumps escapes non-ASCII text by default, no source.{P.ANSWER_CLOSE}"]
    return {"json.dumps": ([search] * 3 + answers) * n_rounds}


def test_samples_keep_sample_0_in_the_article_file_and_every_sample_in_sources(base_cfg, tokenizer, tmp_path):
    queries = write_queries(tmp_path / "q.jsonl", [{"id": 7, "prompt": "How does json.dumps handle non-ASCII text?"}])
    cfg = replace(base_cfg, queries=str(queries), out=str(tmp_path / "o.jsonl"), samples=3, max_tool_calls=1,
                  max_response_tokens=256, max_observation_tokens=64, temperature=1.0)
    engine = ScriptedEngine(tokenizer, _sampled_scripts(2))
    res = generate_articles(cfg, engine=engine, tokenizer=tokenizer, retriever=SearchOnce())
    assert res.generated_ids == ["7"]
    arts = read_lines(Path(cfg.out))
    assert len(arts) == 1 and set(arts[0]) == {"id", "prompt", "article"}  # DeepResearch Bench's format, sample 0
    assert arts[0]["article"] == "json.dumps escapes non-ASCII text by default [json.dumps]."
    src = read_lines(sources_path_for(cfg.out))
    assert [(s["id"], s["sample"]) for s in src] == [(7, 0), (7, 1), (7, 2)]
    assert src[0]["article"] == arts[0]["article"] and "[never.seen]" in src[1]["article"]
    assert [s["grounded_valid"] for s in src] == [True, False, False]  # cited and retrieved / unretrieved / uncited
    assert [s["valid_answer"] for s in src] == [True, True, True]  # the format rule needs no citation
    assert src[1]["grounded_reason"].startswith("cites an id it never retrieved") and src[2]["grounded_reason"] == "no citation"
    assert [s["reward_valid"] for s in src] == [True, True, True]  # reward.citations=any, no citation required
    sidecar = json.loads(cfg.settings_path.read_text())
    assert sidecar["samples"] == 3 and sidecar["settings"]["solver.temperature"] == 1.0

    # resume: nothing twice; a deleted article line regenerates all of its samples, replacing the old ones
    assert generate_articles(cfg, engine=engine, tokenizer=tokenizer, retriever=SearchOnce()).generated_ids == []
    Path(cfg.out).write_text("")
    assert generate_articles(cfg, engine=engine, tokenizer=tokenizer, retriever=SearchOnce()).generated_ids == ["7"]
    assert [(s["id"], s["sample"]) for s in read_lines(sources_path_for(cfg.out))] == [(7, 0), (7, 1), (7, 2)]

    # appending under other settings would mix them in one file: refused, naming what differs
    for change, key in (({"samples": 2}, "samples"), ({"temperature": 0.5}, "solver.temperature"),
                        ({"min_answer_chars": 5}, "reward.min_answer_chars")):
        with pytest.raises(ValueError, match=key):
            generate_articles(replace(cfg, **change), engine=engine, tokenizer=tokenizer, retriever=SearchOnce())


def test_the_prompt_follows_the_runs_harness_state_and_conclusion_line(base_cfg, tokenizer, tmp_path):
    from score_lightning.harness.state import HarnessState
    from score_lightning.roles.prompts import solver_messages
    from score_lightning.roles.rubric import fallback_rubric
    from score_lightning.rollout.chat import encode_chat

    state = {"dimension_constraints": {"k": 2, "must_include": ["citation_grounding"], "weight_max": 0.9},
             "process_constraints": {"citation_cross_check": True}}
    seen = []

    class Recording(ScriptedEngine):
        def generate(self, prompts, params):
            seen.extend(list(p) for p in prompts)
            return super().generate(prompts, params)

    queries = write_queries(tmp_path / "q.jsonl", [{"id": 7, "prompt": "How does json.dumps handle non-ASCII text?"}])
    cfg = replace(base_cfg, queries=str(queries), out=str(tmp_path / "o.jsonl"), harness_state=state,
                  conclusion_line=False, max_tool_calls=2, max_response_tokens=256, max_observation_tokens=64)
    generate_articles(cfg, engine=Recording(tokenizer, _sampled_scripts()), tokenizer=tokenizer, retriever=SearchOnce())
    hs = HarnessState.from_dict(state)
    want = encode_chat(tokenizer, solver_messages(QUERIES[0]["prompt"], fallback_rubric(hs), hs, 2, False))
    assert seen[0] == want
    text = tokenizer.decode(want)
    assert "citation_grounding" in text and "Conclusion:" not in text and "checked against the documents" in text
    default = encode_chat(tokenizer, solver_messages(QUERIES[0]["prompt"], fallback_rubric(HarnessState()),
                                                     HarnessState(), 2))
    assert want != default
    rec = json.loads(cfg.settings_path.read_text())["settings"]
    assert rec["harness.initial_state"]["dimension_constraints"]["k"] == 2 and rec["solver.conclusion_line"] is False


def test_sampled_generation_is_seeded(base_cfg, hf_engine, tokenizer, bm25, tmp_path):
    def sources(out, seed):
        cfg = replace(base_cfg, out=str(tmp_path / out), samples=2, temperature=1.0, limit=2, seed=seed)
        generate_articles(cfg, engine=hf_engine, tokenizer=tokenizer, retriever=bm25)
        return [(s["id"], s["sample"], s["article"], s["response_tokens"]) for s in read_lines(sources_path_for(cfg.out))]

    a = sources("a.jsonl", 0)
    assert [(i, k) for i, k, *_ in a] == [(11, 0), (11, 1), (12, 0), (12, 1)]
    assert a == sources("b.jsonl", 0)  # the same seed: the same samples
    assert a != sources("c.jsonl", 1)
    assert len({x[2] for x in a}) > 1  # sampled, not four copies


def _boom(*args, **kwargs):
    raise AssertionError("nothing may load before the preflight check")


def test_generate_refuses_an_unloadable_model_with_one_error_block(tmp_path, capsys, monkeypatch):
    from score_lightning.evaluation import main
    from score_lightning.policy import models

    monkeypatch.setattr(models, "load_tokenizer", _boom)
    monkeypatch.setattr(models, "load_policy", _boom)
    missing = tmp_path / "no_such_export"
    partial = tmp_path / "partial_export"
    partial.mkdir()
    (partial / "config.json").write_text("{}")
    for model, why in ((missing, "no such directory"), (partial, "lacks weights")):
        rc = main(["generate", "--model", str(model), "--queries", "embedded", "--out", str(tmp_path / "o.jsonl")])
        err = capsys.readouterr().err
        assert rc == 2, err
        assert err.startswith(f"error: --model={str(model)!r} cannot load: ") and why in err, err
        assert "fix:" in err and "Traceback" not in err
    assert not (tmp_path / "o.jsonl").exists()


def test_a_mams_run_is_rolled_out_by_its_own_workflow(base_cfg, tokenizer, tmp_path):
    """A run trained with ``solver.agent=mams`` is evaluated by MaMs's search / state / report roles under the
    run's ``solver.mams`` budgets (read from its run_config.json), and its settings say so; a ReAct run's settings
    stay as they were."""
    from score_lightning.evaluation.settings import evaluation_subset, resolve_settings
    from score_lightning.rollout.scripted import ProtocolResponder
    from score_lightning.rollout.scripted import ScriptedEngine as Scripted

    run = evaluation_subset({"solver": {"agent": "mams", "max_tool_calls": 2, "topk": 1, "temperature": 1.0,
                                        "mams": {"report_tokens": 150, "state_tokens": 120, "bogus": 1}}})
    s, origin = resolve_settings({}, run, 1)
    assert s["solver.agent"] == "mams" and origin["solver.agent"] == "run" and s["solver.mams"]["report_tokens"] == 150
    react, _ = resolve_settings({}, evaluation_subset({"solver": {"max_tool_calls": 2}}), 1)
    assert "solver.agent" not in react and "solver.mams" not in react
    queries = write_queries(tmp_path / "q.jsonl", [{"id": 7, "prompt": "How does json.dumps handle non-ASCII text?"}])
    cfg = replace(base_cfg, queries=str(queries), out=str(tmp_path / "o.jsonl"), max_tool_calls=2, topk=1,
                  temperature=1.0, agent=s["solver.agent"], mams=s["solver.mams"])
    engine = Scripted(tokenizer, ProtocolResponder())
    assert generate_articles(cfg, engine=engine, tokenizer=tokenizer, retriever=SearchOnce()).generated_ids == ["7"]
    roles = {r.role for r in engine.requests}
    assert {"mams_search", "mams_state", "mams_report"} <= roles and "solver" not in roles  # MaMs's roles, not ReAct
    src = read_lines(sources_path_for(cfg.out))[0]
    assert src["search_queries"] and src["article"] and src["grounded_valid"] in (True, False)
    sidecar = json.loads(cfg.settings_path.read_text())["settings"]
    assert sidecar["solver.agent"] == "mams" and sidecar["solver.mams"]["report_tokens"] == 150
    # an evaluation under the react loop is not the same evaluation: resuming it that way is refused
    with pytest.raises(ValueError, match="solver.agent"):
        generate_articles(replace(cfg, agent="react", mams=None), engine=engine, tokenizer=tokenizer,
                          retriever=SearchOnce())
