"""Planning's warning about the cells whose trials and history cannot yet detect the target change: read
from the site's latest run summary, without the results store."""

import json
import time

from mlcampaign.workflow.readiness import detection_warnings, latest_summary

REGRESSION = {"target_change": 0.05}


def entry(cell, verdict, reason=None, smallest=None, trials=None, runs=None, metric="throughput_samples_per_s"):
    return {
        "system": "sys",
        "benchmark": "bench",
        "cell": cell,
        "metric": metric,
        "verdict": verdict,
        "reason": reason,
        "smallest_detectable": smallest,
        "trials_needed": trials,
        "runs_needed": runs,
    }


def test_without_history_every_cell_is_named_and_the_runs_it_needs_said():
    (warning,) = detection_warnings({("sys", "bench", "1x1-fp32"): 3}, REGRESSION, None, "results/c/runs")
    assert "no earlier run of this campaign at this site (results/c/runs)" in warning
    assert "needs 3 earlier runs" in warning and "sys/bench/1x1-fp32" in warning


def test_the_cells_that_cannot_detect_the_target_are_named_with_what_they_need():
    summary = {
        "run_id": "w05",
        "cells": [
            entry("short", "cannot tell yet", "insufficient history", runs=2),
            entry("noisy", "cannot tell yet", "underpowered", smallest=0.09, trials=7, runs=None),
            entry("weekly", "cannot tell yet", "underpowered", smallest=0.12, trials=None),
            entry("fine", "unchanged", smallest=0.03, trials=2),
            entry("enough", "cannot tell yet", "underpowered", smallest=0.06, trials=3, runs=4),
        ],
    }
    cells = {("sys", "bench", name): 3 for name in ("short", "noisy", "weekly", "fine", "enough", "new")}
    (warning,) = detection_warnings(cells, REGRESSION, summary, "unused")
    assert warning.startswith("regression: 5 of 6 cell(s) cannot detect a 5% change")
    assert "as of run w05" in warning
    assert "sys/bench/short (throughput_samples_per_s: needs 1 more run(s) of history)" in warning
    noisy = "sys/bench/noisy (throughput_samples_per_s: smallest detectable change 9.0%, needs 7 trials per run)"
    assert noisy in warning
    assert "sys/bench/weekly (throughput_samples_per_s: smallest detectable change 12.0%, and no number" in warning
    assert "sys/bench/enough (throughput_samples_per_s: smallest detectable change 6.0%, needs more runs" in warning
    assert "sys/bench/new (no history yet)" in warning and "sys/bench/fine" not in warning
    # Seven trials per run are enough for the noisy cell; a 15 % target suits the cells with enough runs.
    assert "noisy" not in detection_warnings(cells | {("sys", "bench", "noisy"): 7}, REGRESSION, summary, "")[0]
    (larger,) = detection_warnings(cells, {"target_change": 0.15}, summary, "")
    assert larger.startswith("regression: 2 of 6 cell(s)") and "short" in larger and "new" in larger


def test_the_latest_summary_of_the_site_is_read_and_planning_stays_fast(tmp_path):
    runs = tmp_path / "runs"
    for run_id, site, started in (("w1", "a", "2026-01-01"), ("w2", "a", "2026-01-08"), ("x9", "b", "2026-02-01")):
        (runs / run_id).mkdir(parents=True)
        summary = {"run_id": run_id, "site": site, "started_utc": started, "cells": []}
        (runs / run_id / "summary.json").write_text(json.dumps(summary))
    (runs / "w3").mkdir()
    (runs / "w3" / "summary.json").write_text("{ half written")
    said = []
    assert latest_summary(runs, "a", "w3", said.append)["run_id"] == "w2"
    assert said == []  # the run being planned is not read
    assert latest_summary(runs, "a", "w2", said.append)["run_id"] == "w1"
    assert [message.split(": ")[1] for message in said] == [str(runs / "w3" / "summary.json")]  # named, left out
    assert latest_summary(runs, "c", "w1", said.append) is None
    many = {("sys", "bench", f"cell{number}"): 3 for number in range(10_000)}
    summary = {"run_id": "w2", "cells": [entry(f"cell{number}", "unchanged") for number in range(10_000)]}
    started = time.perf_counter()
    assert detection_warnings(many, REGRESSION, summary, "") == []
    assert time.perf_counter() - started < 1.0
