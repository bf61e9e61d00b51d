"""The real trainer, export and article generation on checkpoints with Qwen2.5 and Llama-3 tokenizers.

The checkpoints (``tests/real_checkpoints.py``) have random weights over 128k-152k vocabularies:
sampling from them is slow on CPU, so budgets are a few tokens. What is checked is that the
checkpoint's own conventions reach every prompt (chat template, end-of-turn token), that the
step's scalars are finite, and that the exported policy reloads with identical logits.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import FAST, ROOT, compose

#: FAST with shorter generations: every token is a full-vocabulary softmax and sample.
BUDGETS = ["solver.max_response_tokens=16", "evaluator.max_response_tokens=16", "evaluator.max_rubric_tokens=12",
           "solver.max_observation_tokens=16", "evaluator.max_report_tokens=16", "solver.max_prompt_tokens=2048"]

#: the tokens that open an assistant turn in each checkpoint's own chat template
ASSISTANT_OPEN = {"qwen": "<|im_start|>assistant\n", "llama": "<|start_header_id|>assistant<|end_header_id|>\n\n"}
TURN_END = {"qwen": "<|im_end|>", "llama": "<|eot_id|>"}


def _two_steps(ckpt: Path, out: Path) -> tuple[dict, object]:
    from score_lightning.launch.training import run

    box: dict = {}
    cfg = compose(FAST + BUDGETS + [f"model.name_or_path={ckpt}", "trainer.max_steps=2", f"paths.output_dir={out}"])
    metrics = run(cfg, module_hook=lambda m: box.setdefault("module", m))
    return metrics, box["module"]


@pytest.mark.parametrize("kind", ["qwen", "llama"])
def test_two_score_steps_use_the_checkpoint_conventions(kind, request, tmp_path):
    ckpt = request.getfixturevalue(f"{kind}_ckpt")
    metrics, module = _two_steps(ckpt, tmp_path / "run")
    tok = module.tokenizer
    assert tok.eos_token == TURN_END[kind] and tok.pad_token_id is not None
    assert metrics and all(math.isfinite(v) for k, v in metrics.items() if not k.startswith("evaluator/consistency"))
    assert module.score_step == 2
    ro = module.last_step["rollouts"]
    sample = ro.rubrics.samples[0][0]  # the evaluator wrote this step's rubric (random weights: fallback used)
    prompts = {"solver": ro.solver[0].prompt_ids, "scoring": ro.scoring[0].prompt_ids, "rubric": sample.prompt_ids}
    for role, ids in prompts.items():
        text = tok.decode(ids)
        assert text.endswith(ASSISTANT_OPEN[kind]), (role, text[-80:])
        assert text.count(TURN_END[kind]) == 2, (role, text)  # system and user turns, each closed
    if kind == "llama":  # the header tokens are single special ids, not text pieces
        header = tok.convert_tokens_to_ids("<|start_header_id|>")
        ids = ro.solver[0].prompt_ids
        assert ids.count(header) == 3 and ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    for t in ro.solver:
        assert len(t.response_ids) == len(t.response_mask) <= 16
    export = tmp_path / "run" / "export"
    assert (export / "tokenizer_config.json").exists()
    if kind == "llama":  # the exported tokenizer carries the end-of-turn EOS and the pad it was given
        cfg = json.loads((export / "tokenizer_config.json").read_text())
        assert cfg["eos_token"] == "<|eot_id|>" and cfg.get("pad_token") == "<|eot_id|>"


def test_export_reloads_with_identical_logits(qwen_ckpt, tmp_path):
    """``ScoreModule.export_policy`` of a real-tokenizer checkpoint reloads in HF: same logits, same tokenizer."""
    from score_lightning.policy.models import load_policy, load_tokenizer
    from score_lightning.module import ScoreModule

    cfg = compose(FAST + BUDGETS + [f"model.name_or_path={qwen_ckpt}", f"paths.output_dir={tmp_path}"])
    module = ScoreModule(cfg, str(qwen_ckpt))
    module.configure_model()
    with torch.no_grad():  # move the weights off the saved ones, so the reload is not vacuous
        module.policy.lm_head.weight.add_(0.01)
    out = module.export_policy(tmp_path / "export")
    again, tok = load_policy(out).eval(), load_tokenizer(out)
    ids = torch.tensor([tok("<|im_start|>user\n<search>json</search><|im_end|>", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        a = module.policy.eval()(input_ids=ids).logits
        b = again(input_ids=ids).logits
    assert torch.equal(a, b)
    assert tok.eos_token == module.tokenizer.eos_token and tok.chat_template == module.tokenizer.chat_template
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == [151645, 151643]


def test_evaluate_script_runs_on_the_qwen_checkpoint(qwen_ckpt, corpus_file, tmp_path):
    """``scripts/evaluate.py`` (docs/EVALUATION.md) writes one article for one query with the HF engine."""
    queries = tmp_path / "query.jsonl"
    queries.write_text(json.dumps({"id": 1, "prompt": "How does json.dumps handle non-ASCII text?"}) + "\n")
    out = tmp_path / "raw_data" / "qwen.jsonl"
    cmd = [sys.executable, str(ROOT / "scripts" / "evaluate.py"), "generate", "--model", str(qwen_ckpt), "--queries", str(queries),
           "--out", str(out), "--corpus", str(corpus_file), "--max-tool-calls", "1", "--max-response-tokens", "8",
           "--max-observation-tokens", "8", "--topk", "1", "--no-progress"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["id"] == 1 and isinstance(rows[0]["article"], str)
