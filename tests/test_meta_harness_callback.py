"""MetaHarnessCallback with a real Trainer: fires on SCORE steps, not on optimizer steps."""

from __future__ import annotations

import tempfile
from types import SimpleNamespace
from typing import Mapping

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from score_lightning.callbacks.meta_harness import MetaHarnessCallback
from score_lightning.harness.rule_based import RuleBasedHarness
from score_lightning.harness.state import HarnessState


class RecordingHarness(RuleBasedHarness):
    """Rule-based harness that records the SCORE step at each refresh (the module puts it in stats)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[int] = []

    def update(self, state: HarnessState, stats: Mapping[str, float]) -> HarnessState:
        self.calls.append(int(stats["score_step"]))
        return super().update(state, stats)


class TwoPhaseModule(L.LightningModule):
    """Minimal SCORE-shaped module: two optimizer.step() calls per training_step, like solver + evaluator."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.layer = torch.nn.Linear(2, 1)
        self.score_step = 0
        self.harness_state = HarnessState()

    def harness_stats(self) -> dict[str, float]:
        return {"score_step": float(self.score_step), "verified_rate": 0.3}

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        opt = self.optimizers()
        for _ in range(2):
            loss = self.layer(batch).pow(2).mean()
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
        self.score_step += 1

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(torch.randn(12, 2), batch_size=1)


def fit(callback: MetaHarnessCallback, **trainer_kw) -> tuple[L.Trainer, TwoPhaseModule]:
    module = TwoPhaseModule()
    # with logger=False the callback's harness/state text falls back to default_root_dir (the cwd unless set)
    kw = dict(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
              enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
              default_root_dir=tempfile.mkdtemp(prefix="meta_harness_test_"))
    kw.update(trainer_kw)
    trainer = L.Trainer(**kw)
    trainer.fit(module)
    return trainer, module


def test_fires_every_m_score_steps_not_optimizer_steps() -> None:
    harness = RecordingHarness()
    cb = MetaHarnessCallback(harness, every_n_steps=5)
    trainer, module = fit(cb)
    assert module.score_step == 12
    assert trainer.global_step == 24  # optimizer calls: global_step-based logic would fire at 3, 5, 8, 10
    assert harness.calls == [5, 10]
    assert cb.fires == 2
    assert module.harness_state.version == 2
    assert module.harness_state.process_constraints.min_number_of_tool_call == 3  # low-verification rule, twice
    assert trainer.callback_metrics["harness/version"].item() == 2
    assert trainer.callback_metrics["harness/failures"].item() == 0


def test_disabled_never_fires() -> None:
    harness = RecordingHarness()
    _, module = fit(MetaHarnessCallback(harness, every_n_steps=1, enabled=False))
    assert harness.calls == [] and module.harness_state.version == 0


def test_tensorboard_text_and_scalars(tmp_path) -> None:
    logger = TensorBoardLogger(tmp_path, name="", version="run")
    fit(MetaHarnessCallback(RecordingHarness(), every_n_steps=5), logger=logger, log_every_n_steps=1)
    logger.experiment.flush()
    acc = EventAccumulator(logger.log_dir, size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    assert "harness/state/text_summary" in acc.Tags()["tensors"]
    events = acc.Tensors("harness/state/text_summary")
    assert [e.step for e in events] == [0, 5, 10]  # initial constraints, then each refresh at its SCORE step
    last = events[-1].tensor_proto.string_val[0].decode()
    assert '"version": 2' in last and '"min_number_of_tool_call": 3' in last
    # Lightning logs batch i (0-based) at step i, i.e. SCORE step 5 at step 4; the value then stays
    # in the step results, so it repeats every step until the next refresh.
    series = {e.step: e.value for e in acc.Scalars("harness/version")}
    assert min(series) == 4 and series[4] == 1.0 and series[8] == 1.0 and series[9] == 2.0 and max(series) == 11


def test_every_n_steps_must_be_positive() -> None:
    with pytest.raises(ValueError, match=r"harness\.every_n_steps"):
        MetaHarnessCallback(RuleBasedHarness(), every_n_steps=0)


def test_module_without_score_hooks_is_refused() -> None:
    cb = MetaHarnessCallback(RuleBasedHarness())
    module = TwoPhaseModule()
    del module.score_step
    with pytest.raises(AttributeError, match="score_step"):
        cb.setup(SimpleNamespace(), module, "fit")  # type: ignore[arg-type]


class _Failing:
    def __init__(self) -> None:
        self.failures, self.last_error = 0, ""

    def update(self, state: HarnessState, stats: Mapping[str, float]) -> HarnessState:
        self.failures += 1
        self.last_error = "HTTP 500"
        return state


def _fake(step: int) -> tuple[SimpleNamespace, SimpleNamespace]:
    logged: dict[str, float] = {}
    trainer = SimpleNamespace(is_global_zero=True, loggers=[],
                              strategy=SimpleNamespace(broadcast=lambda obj, src=0: obj))
    module = SimpleNamespace(score_step=step, harness_state=HarnessState(), harness_stats=dict, logged=logged,
                             log=lambda name, value, **kw: logged.__setitem__(name, value))
    return trainer, module


def test_no_double_fire_and_failures_logged_and_checkpointed() -> None:
    harness = _Failing()
    cb = MetaHarnessCallback(harness, every_n_steps=2)
    trainer, module = _fake(step=2)
    for _ in range(2):  # e.g. a skipped batch: on_train_batch_end again without score_step advancing
        cb.on_train_batch_end(trainer, module, None, None, 0)  # type: ignore[arg-type]
    assert harness.failures == 1 and cb.fires == 1
    assert module.logged == {"harness/version": 0.0, "harness/failures": 1.0}

    restored = MetaHarnessCallback(_Failing(), every_n_steps=2)
    restored.load_state_dict(cb.state_dict())
    assert restored.state_dict() == cb.state_dict() == {
        "fires": 1, "last_fired_step": 2, "failures": 1, "last_error": "HTTP 500"}
    assert restored.harness.failures == 1
    restored.on_train_batch_end(trainer, module, None, None, 0)  # type: ignore[arg-type]
    assert restored.fires == 1  # resumed at the step it already fired on: no second refresh
