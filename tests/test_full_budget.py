"""A full-budget dry run on CPU: ``experiment=qwen_score`` at the recipe's lengths, one SCORE step.

Every other test runs small budgets, so nothing else exercises what only the recipe's sizes trigger:
a scoring prompt holding 8 reports cut at ``evaluator.max_report_tokens``, an evaluator that makes its
10 verification searches (~520-token observations each) and still writes 2048 tokens of evaluation,
solver responses at 4096 tokens. The model is swapped for a tiny-width Qwen2 over Qwen2.5's real
tokenizer and chat template (``tests/real_checkpoints.py``), the 4-GPU FSDP2 + vLLM setup for one
CPU process (FSDP2 on one device, the scripted engine, the in-process BM25 index over the stdlib
corpus regrouped into long passages, so that observations reach their 512-token cap) and the batch
for one query; every length, K, the tool-call budgets and the step's code path are the recipe's.

The scripted engine writes at full length: the solver searches while its 4096-token budget still
leaves room for a report longer than ``max_report_tokens``, then fills the rest with one cited
report; the evaluator searches 10 times, then writes an evaluation of every report that fills its
2048-token generation budget. The run must raise no budget error, and every evaluation must reach
every report.
"""

from __future__ import annotations

import re
import time

import pytest

from helpers import compose, recipe
from score_lightning import protocol as P
from score_lightning.roles.evaluation import parse_evaluation
from score_lightning.rollout.scripted import ProtocolResponder, ScriptedEngine, ScriptRequest

pytestmark = pytest.mark.slow

_OBS_ID = re.compile(r"<observation>\[([^\]\s]+)\] ")
_OBSERVATION = re.compile(re.escape(P.OBS_OPEN) + r".*?" + re.escape(P.OBS_CLOSE), re.DOTALL)
_RUBRIC_DIM = re.compile(r"^- ([a-z][a-z0-9_]*) \(weight ", re.MULTILINE)
_REPORT_IDS = re.compile(r"Reports \(ids 1\.\.(\d+)\)")
CONCLUSIONS = ("use json.loads for text", "parse the file with json.load", "it depends on the input")
#: tokens kept free below a budget: re-tokenising decoded text can differ a little from the generated ids
MARGIN = 96


class FullBudgetResponder:
    """Scripted answers at the recipe's full lengths (see the module docstring)."""

    def __init__(self, tokenizer, cfg):
        self.tok = tokenizer
        self.solver_budget, self.solver_calls = int(cfg.solver.max_response_tokens), int(cfg.solver.max_tool_calls)
        self.observation = int(cfg.solver.max_observation_tokens) + 24
        self.report_min = int(cfg.evaluator.max_report_tokens) + 200  # longer than the scoring prompt shows
        self.eval_budget, self.eval_calls = int(cfg.evaluator.max_response_tokens), int(cfg.evaluator.max_tool_calls)

    def tokens(self, text: str) -> int:
        return len(self.tok(text, add_special_tokens=False)["input_ids"])

    def filler(self, n: int, cite: str) -> str:
        """About ``n`` tokens of cited prose."""
        sentence = f"The retrieved documentation explains this behaviour, its edge cases and caveats [{cite}]. "
        ids = self.tok(sentence * (max(n, 0) // 8 + 2), add_special_tokens=False)["input_ids"][: max(n, 0)]
        return self.tok.decode(ids).strip()

    def __call__(self, req: ScriptRequest) -> str:
        response = req.context[len(req.prompt):]
        if req.role == "rubric":
            return ProtocolResponder.rubric(req)
        if req.role == "solver":
            return self.solver(req, response)
        if req.role == "scoring":
            return self.scoring(req, response)
        return P.IM_END

    def solver(self, req: ScriptRequest, response: str) -> str:
        used = self.tokens(response)
        words = re.findall(r"[A-Za-z_.]+", req.query)
        if req.turn < self.solver_calls and used + self.observation + self.report_min + MARGIN <= self.solver_budget:
            query = " ".join(words[req.turn % max(len(words), 1):][:4] or ["json"])
            return f"<think>search {req.turn + 1}</think><search>{query}</search>"
        cite = (_OBS_ID.findall(req.context) or ["json"])[0]
        conclusion = f"\n\nConclusion: {CONCLUSIONS[req.index % 3]}."
        room = self.solver_budget - used - MARGIN - self.tokens(conclusion) - 8
        return f"{P.ANSWER_OPEN}{self.filler(room, cite)}{conclusion}{P.ANSWER_CLOSE}"

    def scoring(self, req: ScriptRequest, response: str) -> str:
        if req.turn < self.eval_calls:
            return f"<think>check claim {req.turn + 1}</think><search>{req.query[:40]} claim {req.turn + 1}</search>"
        used = self.tokens(_OBSERVATION.sub("", response))  # observations are outside the generation budget
        dims = _RUBRIC_DIM.findall(req.prompt.split("Rubric:", 1)[-1].split("Process rules", 1)[0])
        ids = range(1, int(_REPORT_IDS.search(req.prompt).group(1)) + 1)

        def report(rid: int, notes: str) -> str:
            scores = "".join(f'<score dim="{d}" value="{3 + (rid + j) % 7}" reason="checked"/>' for j, d in enumerate(dims))
            return (f'<report id="{rid}">{P.VERIFICATION_OPEN}{notes}{P.VERIFICATION_CLOSE}{P.GAP_OPEN}depth'
                    f"{P.GAP_CLOSE}{P.SCORES_OPEN}{scores}{P.SCORES_CLOSE}{P.REPORT_CLOSE}")

        skeleton = self.tokens(P.EVALS_OPEN + "".join(report(r, "") for r in ids) + P.EVALS_CLOSE)
        per_report = (self.eval_budget - used - skeleton - MARGIN) // len(ids)
        return P.EVALS_OPEN + "".join(report(r, self.filler(per_report, "verified")) for r in ids) + P.EVALS_CLOSE


def long_passage_corpus(corpus_file, out) -> None:
    """The stdlib corpus regrouped into passages of ~8 docstrings each, so every observation is cut at its cap."""
    import json

    docs = [json.loads(line) for line in open(corpus_file, encoding="utf-8")]
    with open(out, "w", encoding="utf-8") as fh:
        for i in range(0, len(docs), 8):
            group = docs[i:i + 8]
            text = "\n\n".join(d["contents"].split("\n", 1)[-1] for d in group)
            fh.write(json.dumps({"id": f"doc{i // 8}", "contents": f'"{group[0]["id"]}"\n{text}'}) + "\n")


def test_qwen_score_at_full_budget_runs_one_step_and_every_evaluation_reaches_every_report(qwen_ckpt, corpus_file,
                                                                                           tmp_path):
    from score_lightning.launch.training import run

    long_passage_corpus(corpus_file, tmp_path / "corpus.jsonl")
    cfg = compose([
        *recipe("qwen_score"), f"model.name_or_path={qwen_ckpt}", "trainer.max_steps=1",
        f"retriever.corpus_path={tmp_path / 'corpus.jsonl'}", f"retriever.index_dir={tmp_path / 'bm25'}",
        # what a CPU needs instead of 4 GPUs; every length, K and tool budget stays the recipe's
        "trainer.accelerator=cpu", "trainer.devices=1", "trainer.precision=32-true", "strategy.mixed_precision=null",
        "strategy.cpu_offload=false", "strategy.activation_checkpointing=false", "model.gradient_checkpointing=false",
        "rollout=scripted", "retriever=bm25", "data.batch_size=1", "optim.mini_batch_size=1",
        "trainer.enable_progress_bar=false", f"paths.output_dir={tmp_path}",
    ])
    assert (cfg.solver.num_rollouts, cfg.solver.max_response_tokens, cfg.solver.max_tool_calls) == (8, 4096, 10)
    assert (cfg.evaluator.max_response_tokens, cfg.evaluator.max_tool_calls, cfg.evaluator.max_prompt_tokens) == \
        (2048, 10, 8192)
    box: dict = {}

    def install(module):
        box["module"] = module
        module.engine = module.evaluator_engine = ScriptedEngine(module.tokenizer, FullBudgetResponder(module.tokenizer,
                                                                                                       cfg))

    t0 = time.time()
    run(cfg, module_hook=install)  # raises on any budget error (encode_chat, the budget check, vLLM-free)
    module = box["module"]
    step = module.last_step
    ro, rw, m, tok = step["rollouts"], step["rewards"], step["metrics"], module.tokenizer
    K, report_cap = int(cfg.solver.num_rollouts), int(cfg.evaluator.max_report_tokens)

    # the solver wrote at full length: closed, valid reports longer than the scoring prompt shows them
    assert len(ro.solver) == K
    for t in ro.solver:
        assert t.finished and not t.truncated and len(t.response_ids) <= 4096
        assert len(t.response_ids) >= 4096 - 2 * MARGIN - 64, len(t.response_ids)
        assert t.tool_calls >= 3
    assert all(a.valid for a in rw.answers)
    assert min(len(tok(a.answer, add_special_tokens=False)["input_ids"]) for a in rw.answers) > report_cap
    # the scoring prompt held 8 reports cut at max_report_tokens, within its cap
    (scoring,) = ro.scoring
    assert K * report_cap < len(scoring.prompt_ids) <= int(cfg.evaluator.max_prompt_tokens)
    # the evaluator searched 10 times and still wrote its whole evaluation: 2048 tokens of its own
    assert scoring.tool_calls == 10 and len(scoring.search_queries) == 10
    assert scoring.finished and not scoring.truncated
    assert 2048 - 2 * MARGIN <= scoring.num_model_tokens <= 2048 < len(scoring.response_ids)
    observed = len(scoring.response_ids) - scoring.num_model_tokens  # 10 observations near their 512-token cap
    assert observed > 10 * (int(cfg.evaluator.max_observation_tokens) - 64), observed
    # every evaluation reaches every report: parsed directly, and as the step counted it
    ev = parse_evaluation(scoring.model_text(tok), ro.rubrics.first, K)
    assert ev.valid and sorted(ev.reports) == list(range(1, K + 1)) and all(r.valid for r in ev.reports.values())
    assert rw.reports_valid == [True] * K and rw.eval_valid == [True]
    assert m["evaluator/scoring_valid_rate"] == 1.0 and m["evaluator/report_scores_valid_rate"] == 1.0
    assert m["evaluator/incomplete_rate"] == 0.0 and rw.complete == [True]
    # rewards that train: verified (10 searches >= tau_s), non-zero and not all equal
    assert bool(rw.verified.all()) and float(rw.rewards.min()) > 0 and float(rw.rewards.std()) > 0
    assert step["solver"].updates == 1 and m["solver/grad_norm"] > 0
    print(f"full-budget step: {time.time() - t0:.0f} s, scoring prompt {len(scoring.prompt_ids)} tokens, "
          f"evaluation {scoring.num_model_tokens} written + {len(scoring.response_ids) - scoring.num_model_tokens} "
          f"observed tokens, solver responses {min(len(t.response_ids) for t in ro.solver)}-"
          f"{max(len(t.response_ids) for t in ro.solver)} tokens")
