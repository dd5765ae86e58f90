"""The machine's own series: the canaries of every cell trended per run (Huber run values on the log scale), and
the machine's series per system (median polish of its cells), which a machine-wide shift moves and a shift of
one cell does not; records without canaries (written before them) trend and show as before."""

import math

import numpy as np
import pandas as pd
import pytest
from synthetic_records import HISTORY_CAMPAIGN_CONFIG, add_canaries, synthetic_history

from mlcampaign.analysis.detection import run_series, run_values
from mlcampaign.history.machine import (
    CELL_VALUE_COLUMNS,
    MACHINE_COLUMNS,
    machine_page,
    machine_series,
    median_polish,
)
from mlcampaign.history.merge import AnalysisSettings
from mlcampaign.history.trends import compute_trends
from mlcampaign.plan.canaries import canary_column

CELLS = [("1x1", "fp32"), ("1x2", "fp32"), ("1x2", "bf16")]
SITES = {"site-a": ["alpha-cpu", "beta-cpu"]}
SETTINGS = AnalysisSettings.from_manifest({"campaign_config": HISTORY_CAMPAIGN_CONFIG})


def history(weeks: int = 8, **canaries):
    manifests, records = synthetic_history(SITES, ["bench0", "bench1"], CELLS, weeks, trials=(3, 3), seed=5)
    return manifests, add_canaries(records, seed=6, **canaries)


@pytest.fixture(scope="module")
def slower_memory():
    """beta-cpu's canaries 15 % lower from week 5 on (its memory got slower); alpha-cpu unchanged."""
    manifests, records = history(machine_shifts={"beta-cpu": ("site-a-2026w05", 0.85)})
    return compute_trends(manifests, records, SETTINGS)


def test_a_cells_canary_run_value_is_the_huber_centre_of_its_trials_on_the_log_scale(slower_memory):
    trends = slower_memory
    values = trends.canaries
    assert list(values.columns) == CELL_VALUE_COLUMNS
    key = (values["system"] == "alpha-cpu") & (values["benchmark"] == "bench0") & (values["cell"] == "1x1-fp32")
    triad = values.loc[key & (values["canary"] == "memory_triad_bytes_per_s")].sort_values("run_order")
    trials = trends.trials.loc[
        (trends.trials["system"] == "alpha-cpu")
        & (trends.trials["benchmark"] == "bench0")
        & (trends.trials["cell"] == "1x1-fp32")
    ]
    column = canary_column("memory_triad_bytes_per_s")
    expected = run_values(run_series([group[column].to_numpy() for _, group in trials.groupby("run_order")], "log"))
    assert triad["value"].to_numpy() == pytest.approx(expected)
    assert (triad["n"] == 3).all() and (triad["unit"] == "B/s").all()
    assert triad["level"].to_numpy() == pytest.approx(np.exp(expected))
    # One process: no all-reduce canary for that cell; two processes have one.
    assert values.loc[key & (values["canary"] == "allreduce_bus_bytes_per_s")].empty
    assert not values.loc[(values["cell"] == "1x2-fp32") & (values["canary"] == "allreduce_bus_bytes_per_s")].empty


def test_the_machine_series_moves_with_a_machine_wide_shift_and_only_there(slower_memory):
    machine = slower_memory.machine
    assert list(machine.columns) == MACHINE_COLUMNS
    for canary in ("matmul_flops_per_s", "memory_triad_bytes_per_s", "dataset_read_bytes_per_s"):
        beta = machine.loc[(machine["system"] == "beta-cpu") & (machine["canary"] == canary)]
        before, after = beta.loc[beta["run_order"] < 4, "value"], beta.loc[beta["run_order"] >= 4, "value"]
        assert after.mean() - before.mean() == pytest.approx(math.log(0.85), abs=0.02)
        alpha = machine.loc[(machine["system"] == "alpha-cpu") & (machine["canary"] == canary), "value"]
        assert alpha.abs().max() < 0.03  # 2 % noise a trial, 18 cells a run: its machine did not change
        assert (beta["cells"] == 6).all()  # 2 benchmarks x 3 cells measured every run
    # The level is in the canary's unit, for the system's median cell (the triad is alike in every cell).
    triad = machine.loc[(machine["system"] == "alpha-cpu") & (machine["canary"] == "memory_triad_bytes_per_s")]
    assert triad["level"].to_numpy() == pytest.approx(2.0e10, rel=0.03)


def test_one_cell_off_does_not_move_the_machine():
    """Median polish: a cell whose canary fell (say its node's own memory) is that cell's, not the machine's."""
    runs, cells = 10, 7
    rng = np.random.default_rng(0)
    table = rng.normal(0, 0.01, (cells, runs)) + np.arange(cells)[:, None] * 0.3  # cells at different levels
    table[2, 5:] -= 0.4  # one cell drops by a third
    table[4, [1, 7]] = np.nan  # a cell missing from two runs
    _, cell_effects, run_effects = median_polish(table)
    assert np.abs(run_effects).max() < 0.02
    assert np.median(run_effects) == pytest.approx(0, abs=1e-12)
    assert cell_effects[3] - cell_effects[0] == pytest.approx(0.9, abs=0.03)


def test_runs_without_canaries_still_trend_and_show_none():
    """Records written before the canaries existed (weeks 1-4) and after (weeks 5-8): the trends are the same
    metrics as without any canary, and the machine's series starts at week 5."""
    manifests, plain = synthetic_history(SITES, ["bench0"], CELLS, 8, trials=(3, 3), seed=5)
    later = {manifest["run_id"] for manifest in manifests[4:]}
    manifests, mixed = synthetic_history(SITES, ["bench0"], CELLS, 8, trials=(3, 3), seed=5)
    add_canaries(mixed, runs=later)
    without, with_some = compute_trends(manifests, plain, SETTINGS), compute_trends(manifests, mixed, SETTINGS)
    pd.testing.assert_frame_equal(without.points, with_some.points)
    pd.testing.assert_frame_equal(without.changes, with_some.changes)
    assert without.canaries.empty and without.machine.empty
    assert set(with_some.machine["run_id"]) == later
    assert machine_page(without.canaries, without.machine, "alpha-cpu") == []


def test_the_machine_page_gives_each_canary_with_its_cells_units_and_run_to_run_cv(slower_memory):
    sections = machine_page(slower_memory.canaries, slower_memory.machine, "beta-cpu")
    assert [section["canary"] for section in sections] == [
        "matmul_flops_per_s",
        "memory_triad_bytes_per_s",
        "allreduce_bus_bytes_per_s",
        "dataset_read_bytes_per_s",
    ]
    triad = sections[1]
    assert triad["label"].endswith("(B/s)") and triad["unit"] == "B/s"
    assert len(triad["cells"]) == 6 and triad["cells"][0]["name"] == "bench0 1x1-fp32"
    assert triad["machine"]["text"][0].endswith("GB/s") and len(triad["machine"]["run_id"]) == 8
    assert triad["machine"]["run_cv"] > 0.05  # the 15 % step is run-to-run variation of this history
    alpha = machine_page(slower_memory.canaries, slower_memory.machine, "alpha-cpu")
    assert alpha[1]["machine"]["run_cv"] < 0.02
    assert len(sections[2]["cells"]) == 4  # the all-reduce: only the 1x2 cells
    assert machine_series(slower_memory.canaries.iloc[:0]).empty
