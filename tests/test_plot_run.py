"""``scripts/plot_run.py``: a run folder's TensorBoard scalars become the README's figure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import plot_run  # noqa: E402


def _fake_run(run: Path) -> None:
    """Events laid out as a run writes them: RL scalars in tensorboard/, the cold start's in tensorboard/sft/."""
    w = SummaryWriter(str(run / "tensorboard"))
    for step in range(5):
        w.add_scalar("solver/reward_mean", 0.5 + 0.1 * step, step)
        w.add_scalar("solver/entropy", 1.0 - 0.05 * step, step)
    w.add_scalar("solver/reward_mean", 9.0, 4)  # a resumed run logs step 4 again: the later value counts
    w.close()
    sft = SummaryWriter(str(run / "tensorboard" / "sft"))
    sft.add_scalar("sft/loss", 2.0, 0)
    sft.close()


def test_reads_every_event_file_and_draws_the_score_charts(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _fake_run(run)
    scalars = plot_run.read_scalars(run)
    assert [round(v, 5) for _, v in scalars["solver/reward_mean"]] == [0.5, 0.6, 0.7, 0.8, 9.0]
    assert scalars["sft/loss"] == [(0, 2.0)]
    out = tmp_path / "fig.png"
    drawn = plot_run.plot(run, out)
    # only the charts with logged tags, in the order of the "SCORE" custom-scalars page
    assert drawn == ["solver reward and its parts", "entropy and KL"]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_folder_without_events_is_refused(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "scripts/plot_run.py", str(tmp_path), "--out", str(tmp_path / "x.png")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: no SCORE scalars under") and "Traceback" not in proc.stderr
    assert not (tmp_path / "x.png").exists()


def test_the_smoothed_line_is_tensorboards_debiased_moving_average() -> None:
    # by hand, weight 0.5: EMA 0.5, 1.25, 1.625 over debias 0.5, 0.75, 0.875 -> 1.0, 5/3, 13/7; a NaN keeps the last
    got = plot_run.smooth([1.0, 2.0, 2.0, float("nan")], 0.5)
    assert [round(g, 6) for g in got] == [1.0, round(5 / 3, 6), round(13 / 7, 6), round(13 / 7, 6)]
    assert plot_run.smooth([3.0, -1.0], 0.0) == [3.0, -1.0]  # 0: the raw values


def test_a_smoothing_weight_outside_0_1_is_refused(tmp_path: Path) -> None:
    _fake_run(tmp_path / "run")
    assert plot_run.main([str(tmp_path / "run"), "--out", str(tmp_path / "p.png"), "--smoothing", "1"]) == 2
    assert plot_run.main([str(tmp_path / "run"), "--out", str(tmp_path / "p.png"), "--smoothing", "0.9"]) == 0
