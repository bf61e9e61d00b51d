"""The learning study's merge for a table of relatives (``scripts/bench_learning.py``, ``study_report``,
``study_cells``): each condition over its own cold start, paired differences against one arm, each method's
health and cost from real TensorBoard events, and the evaluator's pair-set scores, against hand computations."""

from __future__ import annotations

import json
import math
import sys

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import bench_learning  # noqa: E402
from study_cells import parse_summary_line, training_summary  # noqa: E402
from study_report import T975, cold_lines, health_table, paired_lines, report, summary_lines  # noqa: E402

BASE = {"grounded_valid": 0.20, "format_valid": 0.8, "citation_precision": 0.5, "item_recall": 0.00}
OWN = {"grounded_valid": 0.40, "format_valid": 0.9, "citation_precision": 0.6, "item_recall": 0.10}


def _cell(cond: str, seed: int, valid: float, recall: float, **train) -> dict:
    return {"condition": cond, "seed": seed,
            "heldout": {"160": {"grounded_valid": valid, "item_recall": recall, "format_valid": 0.9,
                                "citation_precision": 0.6}},
            "train": {"reward_slope": 0.1 * seed, "validity_slope": 0.0, **train}}


def _results() -> list[dict]:
    # grpo_baseline and mams start from different cold starts (BASE, OWN)
    return [_cell("grpo_baseline", 1, 0.30, 0.02, seconds_per_step=3.0),
            _cell("grpo_baseline", 2, 0.40, 0.04, seconds_per_step=5.0),
            _cell("mams", 1, 0.50, 0.20, seconds_per_step=10.0, invalid_actions_mean=1.0),
            _cell("mams", 2, 0.70, 0.30, seconds_per_step=12.0, invalid_actions_mean=3.0)]


def test_each_condition_is_measured_over_its_own_cold_start_and_paired_against_one_arm():
    colds = {"grpo_baseline": BASE, "mams": OWN}
    lines = summary_lines(_results(), colds, ["grpo_baseline", "mams"], 160)
    # grpo: (0.30 - 0.20, 0.40 - 0.20) = (0.10, 0.20): mean 0.15, half-width 12.706 * stdev / sqrt(2) = 12.706 * 0.05
    assert lines[0].startswith("condition=grpo_baseline seeds=2 heldout_valid_delta=+0.150 "
                               "heldout_valid_delta_ci=[-0.485,+0.785] heldout_recall_delta=+0.030")
    # mams over its own cold start: (0.10, 0.30) -> +0.200; recall (0.10, 0.20) -> +0.150
    assert "condition=mams seeds=2 heldout_valid_delta=+0.200" in lines[1]
    assert "heldout_recall_delta=+0.150" in lines[1]
    text = report(_results(), colds, ["grpo_baseline", "mams"], [160], against="grpo_baseline")
    # paired, same seed: valid (0.10 - 0.10, 0.30 - 0.20) = (0.0, 0.1); recall (0.10 - 0.02, 0.20 - 0.04) = (0.08, 0.16)
    half = T975[1] * math.sqrt(0.005) / math.sqrt(2)
    assert f"| mams − grpo_baseline | 2 | +0.050 ± {half:.3f} | +0.120 ± {T975[1] * math.sqrt(0.0032) / math.sqrt(2):.3f} |" in text
    assert "grpo_baseline − mams" not in text
    # at a glance: bracketed intervals, the paired column against the arm, seconds per step
    glance = text.split("In full:")[0]
    assert "| condition | seeds | Δ held-out grounded valid @160 | paired − grpo_baseline |" in glance
    assert (f"| mams | 2 | +0.200 [{0.2 - T975[1] * math.sqrt(0.02) / math.sqrt(2):+.3f}, "
            f"{0.2 + T975[1] * math.sqrt(0.02) / math.sqrt(2):+.3f}] | +0.050 [{0.05 - half:+.3f}, {0.05 + half:+.3f}] |") in glance
    assert glance.count("| grpo_baseline | 2 |") == 1 and "| – | +0.030 [" in glance and "| 11.00 ± " in glance
    # the evaluator column: its cold-start reading, then the end's mean and interval over seeds
    scored = _results()
    for r, end in zip(scored[2:], (0.75, 0.25)):
        r["evaluator_pairs"] = {"cold_start": {"valid_pair_acc": 0.5}, "end": {"valid_pair_acc": end}}
    glance = report(scored, colds, ["grpo_baseline", "mams"], [160], against="grpo_baseline").split("In full:")[0]
    assert f"| 0.500 → 0.500 [{0.5 - T975[1] * 0.25:.3f}, {0.5 + T975[1] * 0.25:.3f}] |" in glance
    # the same pairs as parseable lines, printed before the per-condition lines
    assert paired_lines(_results(), colds, ["grpo_baseline", "mams"], 160, against="grpo_baseline") == [
        f"pair=mams-grpo_baseline seeds=2 heldout_valid_delta=+0.050 heldout_valid_delta_ci="
        f"[{0.05 - half:+.3f},{0.05 + half:+.3f}] heldout_recall_delta=+0.120 heldout_recall_delta_ci="
        f"[{0.12 - T975[1] * math.sqrt(0.0032) / math.sqrt(2):+.3f},{0.12 + T975[1] * math.sqrt(0.0032) / math.sqrt(2):+.3f}]"]
    # without an --against arm: every pair, in the given order
    assert [line.split()[0] for line in paired_lines(_results(), colds, ["mams", "grpo_baseline"], 160)] == [
        "pair=mams-grpo_baseline"]
    # one line per distinct cold start, naming its conditions
    assert [line.split(" (")[0] for line in cold_lines(colds, ["grpo_baseline", "mams"])] == [
        "Cold start of grpo_baseline", "Cold start of mams"]
    shared = cold_lines({"score": BASE, "grpo_baseline": BASE}, ["score", "grpo_baseline"])
    assert len(shared) == 1 and shared[0].startswith("Cold start of score, grpo_baseline (")


def test_health_table_shows_what_each_method_logged_and_the_evaluator_start_and_end():
    results = _results()
    results[2]["evaluator_pairs"] = {"cold_start": {"valid_pair_acc": 0.5, "pair_acc": 0.6, "auc": 0.55, "cohen_d": -0.1},
                                     "end": {"valid_pair_acc": 0.75, "pair_acc": 0.7, "auc": 0.65, "cohen_d": 0.3}}
    results[3]["evaluator_pairs"] = {"cold_start": {"valid_pair_acc": 0.5, "pair_acc": 0.6, "auc": 0.55, "cohen_d": -0.1},
                                     "end": {"valid_pair_acc": 0.25, "pair_acc": 0.5, "auc": 0.45, "cohen_d": -0.5}}
    rows = health_table(results, ["grpo_baseline", "mams"])
    head = next(r for r in rows if r.startswith("| condition |"))
    assert head == ("| condition | invalid actions /step | s / step | valid-pair acc, cold start → end | "
                    "degraded-pair acc, cold start → end | pair AUC, cold start → end | "
                    "pair Cohen's d, cold start → end |")
    grpo = next(r for r in rows if r.startswith("| grpo_baseline |"))
    mams = next(r for r in rows if r.startswith("| mams |"))
    # levels are unsigned: seconds (3, 5) -> 4.00 ± 12.706 * sqrt(2) / sqrt(2); grpo logged no invalid actions
    # and has no pair scores
    assert grpo == f"| grpo_baseline | – | 4.00 ± {T975[1]:.2f} | – | – | – | – |"
    # pair statistics over seeds: valid (0.75, 0.25) -> 0.500 ± 12.706 * 0.25; d (0.3, -0.5) -> -0.100 ± 12.706 * 0.4
    assert mams == (f"| mams | 2.000 ± {T975[1]:.3f} | 11.00 ± {T975[1]:.2f} | 0.500 ± 0.000 → 0.500 ± "
                    f"{T975[1] * 0.25:.3f} | 0.600 ± 0.000 → 0.600 ± {T975[1] * 0.1:.3f} | 0.550 ± 0.000 → 0.550 ± "
                    f"{T975[1] * 0.1:.3f} | -0.100 ± 0.000 → -0.100 ± {T975[1] * 0.4:.3f} |")
    assert health_table([_cell("rule", 1, 0.3, 0.0)], ["rule"]) == []


def test_health_table_drops_a_pair_statistic_no_cell_measured():
    """A preference pair set holds valid pairs only: its degraded-pair accuracy is NaN in every cell, and a
    column of "n/a → n/a" would read as a failed measurement."""
    results = _results()
    nan = float("nan")
    for r in results[2:]:
        r["evaluator_pairs"] = {"cold_start": {"valid_pair_acc": 0.5, "pair_acc": nan, "auc": 0.5, "cohen_d": 0.0},
                                "end": {"valid_pair_acc": 0.6, "pair_acc": nan, "auc": 0.6, "cohen_d": 0.2}}
    head = next(r for r in health_table(results, ["grpo_baseline", "mams"]) if r.startswith("| condition |"))
    assert "degraded-pair acc" not in head
    assert head.endswith("| valid-pair acc, cold start → end | pair AUC, cold start → end | "
                         "pair Cohen's d, cold start → end |")
    # the probe of each model's own reports gets its own columns (tiny writes no valid pairs: none of those)
    results[3]["evaluator_probe"] = {"seed": 1, "cold_start": {"valid_pair_acc": nan, "pair_acc": 0.6},
                                     "end": {"valid_pair_acc": nan, "pair_acc": 0.8}}
    rows = health_table(results, ["grpo_baseline", "mams"])
    head = next(r for r in rows if r.startswith("| condition |"))
    assert head.endswith("pair Cohen's d, cold start → end | own reports: degraded-pair acc, cold start → end |")
    assert next(r for r in rows if r.startswith("| mams |")).endswith("| 0.600 → 0.800 |")


def test_training_summary_reads_health_and_step_seconds_from_real_events(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "tensorboard"))
    rollout, scoring, update = [1.0, 2.0, 9.0], [0.5, 0.5, 0.5], [0.5, 1.5, 0.5]
    for step in range(3):
        writer.add_scalar("solver/reward_mean", 0.1 * step, step)
        writer.add_scalar("time/rollout_s", rollout[step], step)
        writer.add_scalar("time/scoring_s", scoring[step], step)
        writer.add_scalar("time/update_s", update[step], step)
        writer.add_scalar("rubric/write_fail_rate", [0.0, 0.5, 1.0][step], step)
        writer.add_scalar("rubric/buffer_size", [4.0, 6.0, 8.0][step], step)
    writer.add_scalar("stage/judge_valid_rate", 0.25, 2)
    writer.close()
    out = training_summary(tmp_path)
    # step totals 2.0, 4.0, 10.0: the median, not the mean (a first step's compile or an outlier does not move it)
    assert out["seconds_per_step"] == pytest.approx(4.0)
    assert out["write_fail_mean"] == pytest.approx(0.5) and out["items_per_query_mean"] == pytest.approx(6.0)
    assert out["stage_judge_valid_mean"] == pytest.approx(0.25)
    assert math.isnan(out["step_judge_valid_mean"]) and out["steps"] == 3


def test_bench_evaluator_last_line_parses_with_intervals_and_nan():
    line = ("pairs=60 pair_acc=0.733 pair_acc_ci=[0.600,0.867] valid_pairs=0 valid_pair_acc=nan "
            "valid_pair_acc_ci=[nan,nan] auc=0.552 cohen_d=0.265")
    v = parse_summary_line(line)
    assert v["pairs"] == 60 and v["pair_acc"] == 0.733 and (v["pair_acc_lo"], v["pair_acc_hi"]) == (0.6, 0.867)
    assert math.isnan(v["valid_pair_acc"]) and math.isnan(v["valid_pair_acc_hi"]) and v["cohen_d"] == 0.265


def test_cold_cards_share_one_card_per_cold_start_and_settings_and_refuse_a_mismatch(tmp_path, monkeypatch):
    tiny, own = tmp_path / "cold_tiny", tmp_path / "cold_mams"
    for d in (tiny, own):
        d.mkdir()
    settings = {"tiny": {"agent": "react"}, "mams": {"agent": "mams"}}
    carded: list[tuple[str, str]] = []

    def fake_card(model, out, samples, settings_of=None, threads=None, greedy=False):
        carded.append((model.name, out.name))
        agent = json.loads((settings_of / "run_config.json").read_text())["agent"]
        return {"summary": {"grounded_valid": {"mean": 0.1 if agent == "react" else 0.3}},
                "settings": settings["mams" if agent == "mams" else "tiny"]}

    monkeypatch.setattr(bench_learning, "heldout_card", fake_card)

    def cell(cond: str, seed: int, model, agent: str) -> dict:
        export = tmp_path / f"{cond}{seed}"
        export.mkdir()
        (export / "run_config.json").write_text(json.dumps({"agent": agent}))
        return {"condition": cond, "seed": seed, "export": str(export), "cold_start_model": str(model),
                "heldout": {"160": {"settings": settings["mams" if agent == "mams" else "tiny"]}}}

    results = [cell("score", 1, tiny, "react"), cell("grpo_baseline", 1, tiny, "react"), cell("mams", 1, own, "mams")]
    colds = bench_learning.cold_cards(results, tmp_path / "out", "", 2, None)
    assert colds["score"] is colds["grpo_baseline"] and colds["mams"] is not colds["score"]
    assert colds["score"]["grounded_valid"] == 0.1 and colds["mams"]["grounded_valid"] == 0.3
    # one sampled and one greedy card per distinct cold start: four, not six
    tiny_name = bench_learning.cold_card_name("", tiny, settings["tiny"])
    mams_name = bench_learning.cold_card_name("", own, settings["mams"])
    assert tiny_name.startswith("default-cold_tiny-") and mams_name.startswith("default-cold_mams-")
    assert carded == [("cold_tiny", f"cold_start@{tiny_name}"), ("cold_tiny", f"cold_start_greedy@{tiny_name}"),
                      ("cold_mams", f"cold_start@{mams_name}"), ("cold_mams", f"cold_start_greedy@{mams_name}")]
    # a merge over a subset, in another order, reads each cold start's own cached card, never another's
    carded.clear()
    monkeypatch.setattr(bench_learning, "heldout_card",
                        lambda model, out, *a, **k: carded.append((model.name, out.name)) or {
                            "summary": {"grounded_valid": {"mean": 0.3 if model == own else 0.1}},
                            "settings": settings["mams" if model == own else "tiny"]})
    only_mams = bench_learning.cold_cards([results[2]], tmp_path / "out", "", 2, None)
    assert carded[0] == ("cold_mams", f"cold_start@{mams_name}") and only_mams["mams"]["grounded_valid"] == 0.3
    stray = cell("score", 2, tiny, "react")
    stray["heldout"]["160"]["settings"] = {"agent": "react", "temperature": 0.7}
    with pytest.raises(SystemExit, match="score:2 at 160 steps was carded under other settings"):
        bench_learning.cold_cards([*results, stray], tmp_path / "out2", "", 2, None)


def test_a_cell_archived_in_an_earlier_session_is_not_trained_again(tmp_path):
    """A study spans sessions and ``logs/`` does not: a cell whose result is in ``--archive`` but not in ``--out`` is
    taken from the archive (no training: the command returns at once with the archived result)."""
    import subprocess

    archived = {"condition": "score", "seed": 61, "tag": "", "heldout": {"160": {"grounded_valid": 0.25}}}
    cell = tmp_path / "archive" / "score" / "seed61"
    cell.mkdir(parents=True)
    (cell / "result.json").write_text(json.dumps(archived))
    proc = subprocess.run([sys.executable, "scripts/bench_learning.py", "--only", "score:61", "--steps", "160",
                           "--out", str(tmp_path / "logs"), "--archive", str(tmp_path / "archive")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == archived
    assert not (tmp_path / "logs" / "score").exists()  # nothing trained, nothing carded


def test_the_merge_appends_the_study_to_its_own_page_and_leaves_benchmarks_alone(tmp_path, monkeypatch):
    """Issue 72: docs/BENCHMARKS.md holds current figures only. A merge appends its section (its command, the
    tables, the parseable lines) to the study's own page, ``docs/studies/<study>.md`` beside its ``--archive``
    folder; a new page starts with one title, a second merge adds a section under it."""
    import study_report

    monkeypatch.setattr(study_report, "ROOT", tmp_path)  # a wrong target lands in the scratch tree, not the repo
    archive = tmp_path / "docs" / "studies" / "v10"
    for r in _results():
        cell = archive / r["condition"] / f"seed{r['seed']}"
        cell.mkdir(parents=True)
        (cell / "result.json").write_text(json.dumps({**r, "tag": "", "export": "x"}))
    monkeypatch.setattr(bench_learning, "cold_cards", lambda results, *a: {"grpo_baseline": BASE, "mams": OWN})
    argv = ["bench_learning.py", "--merge", str(archive), "--archive", str(archive), "--conditions",
            "grpo_baseline,mams", "--seeds", "1", "2", "--steps", "160", "--out", str(tmp_path / "out")]
    monkeypatch.setattr(sys, "argv", argv)
    assert bench_learning.main() == 0
    assert bench_learning.main() == 0
    assert not (tmp_path / "docs" / "BENCHMARKS.md").exists()
    text = (tmp_path / "docs" / "studies" / "v10.md").read_text(encoding="utf-8")
    assert text.startswith("# ") and text.count("\n# ") == 0
    assert text.count("learning on held-out queries, grpo_baseline, mams") == 2
    assert "--archive" in text and text.count("condition=mams seeds=2 heldout_valid_delta=+0.200") == 2
