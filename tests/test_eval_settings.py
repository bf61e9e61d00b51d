"""Every checkpoint is evaluated as it was trained: the run settings a checkpoint carries, how generate
resolves them (flags win), and the cold start's run_config.json (written beside it, the packaged asset untouched)."""

from __future__ import annotations

import json
import logging

import pytest
from omegaconf import OmegaConf

from helpers import compose
from score_lightning.evaluation import main
from score_lightning.evaluation.settings import (
    RUN_CONFIG,
    describe_diff,
    evaluation_subset,
    read_run_config,
    resolve_settings,
    settings_diff,
    write_run_settings,
)

TINY_STATE = {"dimension_constraints": {"k": 3, "must_include": ["factual_support"], "weight_min": 0.1,
                                        "weight_max": 0.6},
              "process_constraints": {"require_gap_analysis": False, "require_verification": False,
                                      "citation_cross_check": False, "min_number_of_tool_call": 1}, "notes": ""}


def _model_dir(tmp_path, tiny_ckpt, run_config: dict | None, name: str = "export"):
    """A checkpoint directory (the tiny model's files, linked) carrying ``run_config``."""
    d = tmp_path / name
    d.mkdir()
    for f in tiny_ckpt.iterdir():
        (d / f.name).symlink_to(f)
    if run_config is not None:
        (d / RUN_CONFIG).write_text(json.dumps(run_config))
    return d


class Captured(Exception):
    pass


@pytest.fixture
def captured(monkeypatch):
    """Run ``evaluate.py generate`` up to the generation loop; the GenerateConfig it built is returned."""
    import score_lightning.evaluation.generate as G

    box = {}

    def fake(cfg, **kwargs):
        box["cfg"] = cfg
        raise Captured()

    monkeypatch.setattr(G, "generate_articles", fake)

    def run(*argv):
        with pytest.raises(Captured):
            main(["generate", "--queries", "embedded", *argv])
        return box["cfg"]

    return run


def test_generate_takes_the_runs_settings_and_flags_win(tmp_path, tiny_ckpt, captured, capsys):
    cfg = compose(["experiment=tiny_score", "solver.temperature=0.7", "solver.top_p=0.9", "solver.conclusion_line=false"])
    cold = _model_dir(tmp_path, tiny_ckpt, evaluation_subset(cfg), "cold")  # what the cold start writes
    export = _model_dir(tmp_path, tiny_ckpt, OmegaConf.to_container(cfg, resolve=True))  # what an export writes
    for model in (cold, export):
        got = captured("--model", str(model), "--out", str(tmp_path / f"{model.name}.jsonl"), "--topk", "1",
                       "--samples", "4")
        assert (got.max_tool_calls, got.max_response_tokens, got.max_observation_tokens, got.topk) == (3, 384, 64, 1)
        assert (got.temperature, got.top_p, got.samples, got.conclusion_line) == (0.7, 0.9, 4, False)
        assert got.harness_state == TINY_STATE and got.settings()["harness.initial_state"]["dimension_constraints"]["k"] == 3
        assert (got.citations, got.require_citation, got.min_answer_chars) == ("retrieved", True, 20)
        assert got.settings_source == str(model / RUN_CONFIG)
        out = capsys.readouterr().out
        assert f"settings (from {model / RUN_CONFIG}" in out and "topk=1*" in out and "max_response_tokens=384 " in out
        assert "temperature=0.7 " in out and "citations=retrieved" in out and '"k":3' in out
    # an explicit 0 is a flag too; --run-config none falls back to the defaults (greedy for one sample)
    assert captured("--model", str(cold), "--out", str(tmp_path / "g.jsonl"), "--temperature", "0").temperature == 0.0
    plain = captured("--model", str(cold), "--out", str(tmp_path / "p.jsonl"), "--run-config", "none")
    assert (plain.max_tool_calls, plain.max_response_tokens, plain.temperature, plain.harness_state) == (10, 4096, 0.0, None)
    assert plain.settings_source is None and plain.settings()["harness.initial_state"]["dimension_constraints"]["k"] == 4
    bare = _model_dir(tmp_path, tiny_ckpt, None, "bare")
    assert captured("--model", str(bare), "--out", str(tmp_path / "b.jsonl"), "--samples", "4").temperature == 1.0
    # another run's settings for this checkpoint (the cold start evaluated as a run's export was)
    other = captured("--model", str(bare), "--out", str(tmp_path / "o.jsonl"), "--run-config", str(export / RUN_CONFIG))
    assert (other.max_response_tokens, other.temperature) == (384, 0.7)


def test_resolve_settings_by_hand():
    run = {"solver": {"max_tool_calls": "2", "temperature": 0.5, "agent": "react"}, "reward": {"citations": "retrieved"}}
    s, origin = resolve_settings({"solver.topk": 5, "solver.max_tool_calls": None}, run, samples=8)
    assert (s["solver.max_tool_calls"], s["solver.topk"], s["solver.temperature"], s["solver.max_response_tokens"]) == \
        (2, 5, 0.5, 4096)
    assert origin["solver.max_tool_calls"] == "run" and origin["solver.topk"] == "flag"
    assert origin["solver.max_response_tokens"] == "default" and s["reward.citations"] == "retrieved"
    assert resolve_settings({}, {}, samples=8)[0]["solver.temperature"] == 1.0
    assert resolve_settings({}, {}, samples=1)[0]["solver.temperature"] == 0.0
    assert settings_diff({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 0}) == ["b", "c"] and settings_diff({"a": 1}, {"a": 1}) == []
    state = {"dimension_constraints": {"k": 3, "weight_max": 0.6}, "notes": ""}
    a = {"solver.topk": 2, "harness.initial_state": state}
    b = {"solver.topk": 2, "harness.initial_state": {**state, "dimension_constraints": {"k": 4, "weight_max": 0.6}},
         "solver.top_p": 0.9}
    assert describe_diff(a, b) == ("harness.initial_state.dimension_constraints.k (3 this, 4 baseline), "
                                   "solver.top_p (absent this, 0.9 baseline)")
    assert "no settings recorded for baseline" in describe_diff(a, None)


def test_an_older_run_config_resolves_as_a_current_one():
    """A run_config.json written before keys were removed (``loss.norm_adv_by_std``, ``loss.clip_ratio_*``,
    ``optim.warmup_ratio``) or added (``solver.conclusion_line`` here) resolves as a current one: the removed keys
    are mapped, never an error, and a key the file predates takes the evaluation default."""
    old = {"solver": {"max_tool_calls": 4, "topk": 2}, "loss": {"norm_adv_by_std": False, "clip_ratio_high": 0.28},
           "optim": {"warmup_ratio": None}, "reward": {"citations": "retrieved"}}
    s, origin = resolve_settings({}, old, samples=1)
    assert (s["solver.max_tool_calls"], s["solver.topk"], s["reward.citations"]) == (4, 2, "retrieved")
    assert s["solver.conclusion_line"] is True and origin["solver.conclusion_line"] == "default"


def test_write_run_settings_first_writer_wins_and_templates_travel_as_text(tmp_path, caplog):
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    first = compose(["experiment=tiny_score", f"model.chat_template={template}"])
    path = write_run_settings(tmp_path, first, note="test")
    saved = read_run_config(tmp_path)
    assert path == tmp_path / RUN_CONFIG and saved["model"]["chat_template"] == template.read_text()
    assert saved["solver"]["max_response_tokens"] == 384 and saved["reward"] == {
        "citations": "retrieved", "require_citation": True, "min_answer_chars": 20}
    assert saved["harness"]["initial_state"] == TINY_STATE and saved["solver"]["agent"] == "react"
    assert "optim" not in saved and "paths" not in saved  # only what evaluation reads
    with caplog.at_level(logging.WARNING):
        write_run_settings(tmp_path, compose(["experiment=tiny_score", "solver.temperature=0.3"]))
    assert read_run_config(tmp_path) == saved and "solver.temperature" in caplog.text


def test_package_leaves_the_run_settings_out(tmp_path):
    from score_lightning.sft.asset import MANIFEST, package

    built = tmp_path / "sft-0123456789abcdef"
    built.mkdir()
    (built / "config.json").write_text("{}")
    (built / RUN_CONFIG).write_text("{}")
    manifest = package(built, asset=tmp_path / "asset")
    assert set(manifest["files"]) == {"config.json"} and not (tmp_path / "asset" / RUN_CONFIG).exists()
    assert json.loads((tmp_path / "asset" / MANIFEST).read_text()) == manifest


def test_the_cold_start_carries_its_run_settings_and_is_evaluated_under_them(tmp_path, tiny_ckpt, corpus_file,
                                                                           cache_dir, capsys):
    from score_lightning.sft import run_sft
    from score_lightning.sft.asset import ASSET_DIR, MANIFEST, file_sha256

    manifest = json.loads((ASSET_DIR / MANIFEST).read_text())
    cfg = compose(["experiment=tiny_score", f"paths.cache_dir={cache_dir}", f"sft.cache_dir={tmp_path / 'sft'}",
                   f"paths.output_dir={tmp_path / 'run'}", "logger=none"])
    out = run_sft(cfg, str(tiny_ckpt))  # installs the packaged cold start: no training
    assert out.name == manifest["key"]
    assert read_run_config(out) == {**evaluation_subset(cfg), "_note": read_run_config(out)["_note"]}
    assert {p.name for p in out.iterdir()} == set(manifest["files"]) | {RUN_CONFIG}
    assert all(file_sha256(out / n) == d for n, d in manifest["files"].items())  # the checkpoint as packaged
    assert sorted(p.name for p in ASSET_DIR.iterdir()) == sorted([*manifest["files"], MANIFEST])
    (out / RUN_CONFIG).unlink()  # a cache filled before this file existed: backfilled when reused
    assert run_sft(cfg, str(tiny_ckpt)) == out and (out / RUN_CONFIG).is_file()

    arts = tmp_path / "held.jsonl"
    capsys.readouterr()
    assert main(["generate", "--model", str(out), "--queries", "embedded", "--split", "heldout", "--limit", "2",
                 "--samples", "2", "--out", str(arts), "--corpus", str(corpus_file),
                 "--index-dir", str(cache_dir / "bm25"), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert f"settings (from {out / RUN_CONFIG}" in printed and "max_tool_calls=3 max_response_tokens=384" in printed
    assert len(arts.read_text().splitlines()) == 2
    assert main(["card", "--articles", str(arts), "--corpus", str(corpus_file),
                 "--index-dir", str(cache_dir / "bm25")]) == 0
    card = json.loads((tmp_path / "held.card.json").read_text())
    assert card["answers"] == 4 and [r["samples"] for r in card["per_query"]] == [2, 2]
    s = card["settings"]
    assert (s["solver.max_tool_calls"], s["solver.topk"], s["solver.temperature"], s["reward.citations"]) == \
        (3, 2, 1.0, "retrieved")
    assert s["harness.initial_state"] == TINY_STATE and 0.0 <= card["summary"]["grounded_valid"]["mean"] <= 1.0


def test_a_trained_cold_start_carries_its_run_settings(tmp_path, tiny_ckpt, corpus_file, cache_dir):
    from omegaconf import open_dict

    from score_lightning.sft import run_sft
    from score_lightning.sft.cache import META_FILE

    cfg = compose(["experiment=tiny_score", f"paths.output_dir={tmp_path / 'run'}", f"paths.cache_dir={cache_dir}",
                   "logger=none", "trainer.enable_progress_bar=false", "solver.temperature=0.8"])
    with open_dict(cfg):  # a few demonstrations, one epoch: another key than the packaged one, so it trains
        cfg.sft.merge_with({"enabled": True, "use_packaged": False, "num_solver_demos": 2, "num_rubric_demos": 2,
                            "num_scoring_demos": 1, "responses_per_prompt": {"solver": 1, "rubric": 2, "scoring": 1},
                            "epochs": 1, "batch_size": 2, "warmup_steps": 0, "cache_dir": str(tmp_path / "sft"),
                            "probe": {"num_rubrics": 0, "num_solver": 0, "num_scoring": 0}})
    out = run_sft(cfg, str(tiny_ckpt))
    assert (out / META_FILE).is_file() and not list(out.parent.glob(".tmp-sft-*"))
    saved = read_run_config(out)
    assert saved["solver"]["temperature"] == 0.8 and saved["harness"]["initial_state"] == TINY_STATE
    assert resolve_settings({}, saved, 1)[0]["solver.max_response_tokens"] == 384
