"""Each config key has one default, in configs/: no source module reads a key through a fallback of its own.

Why a scan: a ``node.get("key", value)`` (or ``OmegaConf.select(cfg, "a.key", default=value)``) keeps a second default that silently wins when the YAML is renamed, and lets a
missing key pass unnoticed. With the schema merged every key exists, so a config read is a plain attribute. A
line that reads plain data whose key happens to share a config key's name says so with ``# data, not config``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import ROOT, compose

MARK = "# data, not config"
#: option combinations whose keys together cover every group option
COVER = [["experiment=tiny_score"], ["experiment=qwen_score", "data.queries_path=q.jsonl"],
         ["retriever=mcp", "rollout=vllm", "strategy=fsdp", "rubric=drrubric", "harness=llm", "model=smollm2_135m"],
         ["retriever=http", "rollout=scripted", "strategy=ddp", "rubric=evolving"], ["rubric=given"],
         ["experiment=mams_tiny"], ["experiment=arco_tiny"]]


def _config_key_names() -> set[str]:
    from omegaconf import DictConfig

    names: set[str] = set()

    def walk(node: DictConfig) -> None:
        for key in node.keys():
            names.add(str(key))
            child = node._get_node(key)
            if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
                walk(child)

    for overrides in COVER:
        cfg = compose(overrides)
        walk(cfg)
    return names - {"hydra"}


def _literal_default_reads(path: Path, keys: set[str]) -> list[str]:
    text = path.read_text()
    lines = text.splitlines()
    out = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        key = None
        if isinstance(f, ast.Attribute) and f.attr == "get" and node.args and isinstance(node.args[0], ast.Constant):
            key = node.args[0].value  # node.get("key") / node.get("key", value)
        elif (isinstance(f, ast.Attribute) and f.attr == "select" and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and any(k.arg == "default" for k in node.keywords)):
            key = str(node.args[1].value).rsplit(".", 1)[-1]  # OmegaConf.select(cfg, "a.key", default=value)
        if not isinstance(key, str) or key not in keys:
            continue
        span = lines[node.lineno - 1:node.end_lineno]
        if not any(MARK in line for line in span):
            out.append(f"{path.relative_to(ROOT)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return out


def test_no_from_cfg_constructors_are_left():
    hits = [f"{p.relative_to(ROOT)}" for p in (ROOT / "src").rglob("*.py") if "from_cfg" in p.read_text()]
    assert not hits, hits


def test_no_source_module_reads_a_config_key_with_a_default_of_its_own():
    keys = _config_key_names()
    assert {"num_rollouts", "loss_type", "grammar_fast_forward", "connect_timeout_s"} <= keys  # the cover is whole
    found = [hit for p in sorted((ROOT / "src").rglob("*.py")) for hit in _literal_default_reads(p, keys)]
    assert not found, "\n".join(found)


def test_the_scan_finds_a_fallback_read(tmp_path):
    bad = ROOT / "src" / "score_lightning" / "_scan_probe.py"
    try:
        bad.write_text('def f(cfg):\n    return cfg.solver.get("num_rollouts", 8)\n\n\n'
                       'def g(row):\n    return row.get("num_rollouts", 0)  # data, not config\n')
        hits = _literal_default_reads(bad, {"num_rollouts"})
    finally:
        bad.unlink()
    assert len(hits) == 1 and ":2:" in hits[0]
