"""``experiment=grpo_judge_tiny`` against a real OpenAI-compatible judge: ``vllm serve`` on the tiny model
(marked vllm; ``make test-vllm``).

The served tiny model is random, so its replies are held to the pointwise scoring XML by vLLM's structured
outputs (a regex sent through ``judge.extra_body``): the tags and the rubric's dimension names are fixed, the
values (1..10) and the free text are the model's own samples. The solver is the scripted engine, so every step
has reports to judge. What runs for real: the SDK through the process-wide limiter, vLLM's chat template and
sampling, the evaluator role's parser on the reply, the rewards, the update, the ``judge/*`` scalars.
"""

from __future__ import annotations

import re

import pytest

from helpers import FAST, compose
from test_harness_vllm_serve import vllm_server  # noqa: F401 (the module-scoped server fixture)

pytestmark = pytest.mark.vllm  # conftest fails these tests when vllm cannot be imported

OBS_ID = re.compile(r"<observation>\[([^\]\s]+)\] ")


def scoring_regex(dims) -> str:
    text = "[a-z ]{1,24}"
    scores = "".join(f'<score dim="{d}" value="([1-9]|10)" reason="{text}"/>' for d in dims)
    return (f'<report_evaluations><report id="1"><verification>{text}</verification><gap_analysis>{text}'
            f"</gap_analysis><scores>{scores}</scores></report></report_evaluations>")


def respond(req) -> str:
    if req.turn == 0:
        return "<think>look it up</think><search>" + " ".join(req.query.split()[:3]) + "</search>"
    cite = OBS_ID.search(req.context).group(1)
    return f"<answer>The documentation covers the question [{cite}].\n\nConclusion: see the module.</answer>"


def test_grpo_judge_tiny_trains_three_steps_with_nonzero_judge_scores(tmp_path, tiny_ckpt, vllm_server):  # noqa: F811
    steps = run_grpo_judge_tiny(tmp_path, vllm_server, "tiny")
    assert len(steps) == 3
    for step in steps:
        rw, m = step["rewards"], step["metrics"]
        assert m["judge/failed_rate"] == 0.0 and m["judge/requests"] == len(rw.answers)
        scores = [float(s.sum()) for s in rw.item_scores]
        assert all(s > 0 for s in scores)  # every judged report got non-zero scores from the served model
        assert float(rw.rubric_part.min()) > 0 and float(rw.rewards.min()) > 1.0


def run_grpo_judge_tiny(tmp_path, base_url: str, model: str) -> list[dict]:
    """Three steps of experiment=grpo_judge_tiny, the judge at ``base_url`` held to the scoring XML."""
    import lightning as L
    from omegaconf import OmegaConf, open_dict

    from score_lightning.harness.state import HarnessState
    from score_lightning.launch.training import run
    from score_lightning.roles.rubric import fallback_rubric
    from score_lightning.rollout.scripted import ScriptedEngine

    base = [o for o in FAST if not o.startswith("experiment=")]
    probe = compose(["experiment=grpo_judge_tiny", *base])
    dims = fallback_rubric(HarnessState.from_dict(OmegaConf.to_container(probe.harness.initial_state))).dims
    cfg = compose(["experiment=grpo_judge_tiny", *base, f"paths.output_dir={tmp_path}", "trainer.max_steps=3",
                   "optim.warmup_steps=0", "solver.max_response_tokens=160", f"judge.base_url={base_url}",
                   f"judge.model={model}", "judge.api_key_env=null", "judge.timeout_s=120", "judge.max_tokens=512",
                   "judge.temperature=1.0", "judge.max_concurrency=4"])
    with open_dict(cfg):
        cfg.judge.extra_body = {"structured_outputs": {"regex": scoring_regex(dims)}}
    steps = []

    class Keep(L.Callback):
        def on_train_batch_end(self, trainer, module, *args):
            steps.append(module.last_step)

    run(cfg, extra_callbacks=[Keep()], module_hook=lambda m: setattr(m, "engine", ScriptedEngine(m.tokenizer, respond)))
    return steps
