"""``evaluator.source=external`` (``experiment=grpo_judge_tiny``): a real SCORE trainer whose reports are scored by
an OpenAI-compatible judge on loopback that injects faults (429 with Retry-After, a hang past the deadline, 500,
garbage). The run finishes, ``judge/failed_rate`` equals the injected faults, the server never holds more than
``judge.max_concurrency`` requests, no failed judgement enters an advantage (checked by hand), and a step where
every judgement fails stops the run with an error naming the endpoint and the kinds, its last checkpoint
resumable. The solver is the scripted engine, so every report is valid and its reward is known in advance."""

from __future__ import annotations

import re

import pytest

from helpers import FAST, compose, read_scalars
from openai_stub import OpenAIStub, Reply
from judge_fixtures import B, K, ROW, Solver, _grpo, _train, evaluation
from score_lightning.errors import JudgeUnavailable
from score_lightning.rollout.scripted import ScriptedEngine

PLAN = {0: 9, 1: "500", 2: 3, 3: 6, 4: "hang", 5: "429", 6: "garbage", 7: 5}


def faulty_judge(request: dict):
    prompt = request["messages"][1]["content"]  # re-asks append messages after the scoring prompt
    plan = PLAN[int(ROW.search(prompt).group(1))]
    if plan == "500":
        return Reply(status=500)
    if plan == "429":
        return Reply(status=429, headers={"Retry-After": "0.05"})
    if plan == "hang":
        return Reply(content=evaluation(prompt, 7), delay_s=6.0)
    if plan == "garbage":
        return "The report seems fine overall, I would give it a good mark."
    return Reply(content=evaluation(prompt, plan), delay_s=0.05)


def _cfg(tmp_path, stub: OpenAIStub, *overrides: str):
    base = [o for o in FAST if not o.startswith(("experiment=", "solver.num_rollouts", "data.batch_size",
                                                  "optim.mini_batch_size", "optim.micro_batch_size"))]
    return compose(["experiment=grpo_judge_tiny", *base, f"paths.output_dir={tmp_path}", f"solver.num_rollouts={K}",
                    f"data.batch_size={B}", f"optim.mini_batch_size={B}", "optim.micro_batch_size=4",
                    "optim.warmup_steps=0", "solver.max_response_tokens=160", "reward.require_citation=true",
                    f"judge.base_url={stub.base_url}", "judge.model=judge-x", "judge.api_key_env=null",
                    "judge.max_concurrency=2", "judge.timeout_s=1.0", "judge.max_retries=1", *overrides])


def test_failed_judgements_leave_the_update_and_are_counted(tmp_path, tiny_ckpt, corpus_file):
    with OpenAIStub(content=faulty_judge) as stub:
        steps = _train(_cfg(tmp_path, stub, "trainer.max_steps=2", "judge.max_failed_rate=0.6"), Solver())
        in_flight = stub.in_flight_max
    assert len(steps) == 2  # the run finished
    failed = [r for r, p in PLAN.items() if isinstance(p, str)]
    for step in steps:
        rw, m = step["rewards"], step["metrics"]
        assert rw.validity.tolist() == [1.0] * (B * K)  # every report valid: only the judge decides
        assert rw.judged == [r not in failed for r in range(B * K)]
        assert rw.excluded.tolist() == [r in failed for r in range(B * K)]  # drop, as evaluator.on_incomplete=drop
        assert rw.judge.kinds == {"http_500": 1, "timeout": 1, "http_429": 1, "unparseable": 1}
        assert m["judge/failed_rate"] == pytest.approx(4 / 8)
        assert 1.0 <= m["judge/in_flight_max"] <= 2.0 and m["judge/latency_s"] > 0
        # R = a(r) (1 + sum_j w_j v/10) = 1 + v/10 for a uniform score v; advantages over the judged reports only
        adv = step["solver"].advantages.tolist()
        assert rw.rewards.view(B, K)[0, [0, 2, 3]].tolist() == pytest.approx([1.9, 1.3, 1.6])
        assert [adv[0], adv[2], adv[3]] == pytest.approx(_grpo([1.9, 1.3, 1.6]), abs=1e-5)  # [1, -1, 0]
        assert adv[1] == 0.0  # the failed judgement
        assert adv[4:] == [0.0] * 4  # one judged report left in group 2: no group, no advantage
        assert m["solver/zero_advantage_group_rate"] == pytest.approx(0.5)
    assert in_flight <= 2  # the server never held more than judge.max_concurrency requests
    scalars = read_scalars(tmp_path)
    assert [v for _, v in scalars["judge/failed_rate"]] == pytest.approx([0.5, 0.5])
    assert "judge/in_flight_max" in scalars and "judge/latency_s" in scalars


def test_a_step_whose_judgements_all_fail_stops_the_run_and_the_last_checkpoint_resumes(tmp_path, tiny_ckpt,
                                                                                          corpus_file):
    healthy = [True]

    def judge(request: dict):
        if not healthy[0]:
            return Reply(status=503)
        prompt = request["messages"][1]["content"]
        return evaluation(prompt, 4 + int(ROW.search(prompt).group(1)) % K)

    cfg = lambda *o: _cfg(tmp_path, stub, "callbacks.model_checkpoint.every_n_steps=1", *o)  # noqa: E731
    with OpenAIStub(content=judge) as stub:
        import lightning as L

        class Break(L.Callback):  # the judge goes down after the first step
            def on_train_batch_end(self, *args):
                healthy[0] = False

        from score_lightning.launch.training import run

        solver = Solver()
        with pytest.raises(JudgeUnavailable) as err:
            run(cfg("trainer.max_steps=3"), extra_callbacks=[Break()],
                module_hook=lambda m: setattr(m, "engine", ScriptedEngine(m.tokenizer, solver)))
        msg = str(err.value)
        assert f"{stub.base_url}/chat/completions (model judge-x)" in msg and "8 of 8 judgements failed" in msg
        assert "http_503 x8" in msg and "judge.max_failed_rate=0.5" in msg and "ckpt_path=last" in msg
        last = tmp_path / "checkpoints" / "last.ckpt"
        assert last.exists()
        import torch

        assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 1  # the step before
        healthy[0] = True  # the judge is back: resume from that checkpoint and finish
        steps = _train(cfg("trainer.max_steps=2", f"ckpt_path={last}"), Solver())
    assert len(steps) == 1 and steps[0]["metrics"]["judge/failed_rate"] == 0.0


def test_under_async_rollouts_the_worker_judges_and_its_tally_reaches_the_trainer(tmp_path, tiny_ckpt, corpus_file):
    """rollout.mode=async: the worker process scores through the judge (its own limiter of the same size); the
    step's tally travels with the batch and is logged by the trainer."""
    from score_lightning.launch.training import run

    def judge(request: dict):
        prompt = request["messages"][1]["content"]
        return Reply(content=evaluation(prompt, 6), delay_s=0.02)

    with OpenAIStub(content=judge) as stub:
        cfg = _cfg(tmp_path, stub, "trainer.max_steps=2", "rollout=scripted", "rollout.mode=async")
        metrics = run(cfg)
        sent = len(stub.chat_requests)
    assert metrics["judge/failed_rate"] == 0.0 and metrics["judge/requests"] > 0
    assert 1.0 <= metrics["judge/in_flight_max"] <= 2.0
    assert sent >= 2 * metrics["judge/requests"]  # steps 0 and 1 (and the batch generated ahead for step 2)


def test_the_judge_reads_each_report_beside_the_passage_it_cites(tmp_path, tiny_ckpt, corpus_file, bm25):
    """``evaluator.show_passages=true`` in a real step: every prompt the loopback judge received shows the report's
    cited id with the corpus passage's text, as a grounded citation (its solver's search returned it)."""
    from score_lightning.roles.cited_passages import CITED_HEAD, NOT_RETRIEVED

    prompts = []

    def judge(request: dict):
        prompt = request["messages"][1]["content"]
        prompts.append(prompt)
        return evaluation(prompt, 6)

    with OpenAIStub(content=judge) as stub:
        steps = _train(_cfg(tmp_path, stub, "trainer.max_steps=1", "evaluator.show_passages=true",
                            "evaluator.passage_tokens=16"), Solver())
    assert len(steps) == 1 and len(prompts) == B * K
    texts = {d.id: d.text for d in bm25.docs}
    for prompt in prompts:
        cite = re.search(r"on the question \[([^\]\s]+)\]", prompt).group(1)
        block = prompt[prompt.index(CITED_HEAD):]
        head = f"{CITED_HEAD}\n[{cite}] "
        assert block.startswith(head) and NOT_RETRIEVED not in block
        shown = block[len(head):].splitlines()[0]
        assert shown and texts[cite].startswith(shown.split(" ")[0])
