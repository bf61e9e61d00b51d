"""What the judge tests share: a scripted solver whose reports name their row, the judgements a loopback judge sends,
a real run that keeps each step, and GRPO's group advantages by hand (``test_judge_reward``, ``test_unjudged_reports``)."""

from __future__ import annotations

import re

from score_lightning.rollout.scripted import ScriptedEngine, ScriptRequest

K, B = 4, 2
OBS_ID = re.compile(r"<observation>\[([^\]\s]+)\] ")
ROW = re.compile(r"report from row (\d+)")
DIM = re.compile(r"^- ([a-z][a-z0-9_]*) \(weight ", re.MULTILINE)


class Solver:
    """Search once, then answer citing the first observed id; the report names its row for the judge stub."""

    def __init__(self, items: str = ""):
        self.turn0, self.rows, self.items = 0, {}, items

    def __call__(self, req: ScriptRequest) -> str:
        if req.role == "items":  # rubric=evolving: the evaluator writes the query's items
            return self.items
        assert req.role == "solver", req.role
        if req.turn == 0:
            self.rows[(req.query, req.index)] = self.turn0 % (B * K)  # turn 0 is generated in row order
            self.turn0 += 1
            return "<think>look it up</think><search>" + " ".join(req.query.split()[:3]) + "</search>"
        cite = OBS_ID.search(req.context).group(1)
        row = self.rows[(req.query, req.index)]
        return f"<answer>A report from row {row} on the question [{cite}]. Conclusion: c{row}.</answer>"


def evaluation(prompt: str, values, verification: bool = True, drop_last: bool = False) -> str:
    """A closed judgement of report 1: ``values`` is one value for every dimension, or one per dimension in order
    (``drop_last``: the last dimension left unscored)."""
    dims = DIM.findall(prompt)[:-1] if drop_last else DIM.findall(prompt)
    values = [values] * len(dims) if isinstance(values, (int, float)) else list(values)
    scores = "".join(f'<score dim="{d}" value="{v}" reason="r"/>' for d, v in zip(dims, values))
    ver = "<verification>checked the cited passage</verification>" if verification else ""
    return (f'<report_evaluations><report id="1">{ver}<gap_analysis>nothing missing</gap_analysis>'
            f"<scores>{scores}</scores></report></report_evaluations>")


def _train(cfg, solver: Solver, keep=None):
    import lightning as L

    from score_lightning.launch.training import run

    steps = []

    class Keep(L.Callback):
        def on_train_batch_end(self, trainer, module, *args):
            steps.append(module.last_step if keep is None else keep(module))

    def install(module):
        module.engine = module.evaluator_engine = ScriptedEngine(module.tokenizer, solver)

    run(cfg, extra_callbacks=[Keep()], module_hook=install)
    return steps


def _grpo(rewards: list[float]) -> list[float]:
    mean = sum(rewards) / len(rewards)
    std = (sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1)) ** 0.5
    return [(r - mean) / (std + 1e-6) for r in rewards]
