"""Repeatability of each cell: spread of the metrics over seeds and same-seed replicates.

Statistics per cell (system x benchmark x scale x precision) and metric over the cell's ok trials:
n, mean, median, std, CV, min, max, the t and bootstrap intervals of the mean, the MLPerf olympic
mean, and (when the campaign has same-seed replicates) the split of the spread into seed variance
and run-to-run system noise. Convergence per cell: the fraction of trials that reached the target
(Wilson interval) and the distribution of epochs-to-target.
"""

from __future__ import annotations

import pandas as pd

from mlcampaign.analysis.frame import CELL_COLUMNS, CELL_KEYS
from mlcampaign.analysis.stats import CellBootstrap, describe, variance_components, wilson_interval
from mlcampaign.plan.metrics import COMPARABLE_METRICS, METRICS

# The metrics summarised per cell, with what each is (mlcampaign.plan.metrics).
SUMMARISED_METRICS = {name: METRICS[name].description for name in COMPARABLE_METRICS}


def repeatability_table(ok_trials: pd.DataFrame, bootstrap: CellBootstrap, confidence: float) -> pd.DataFrame:
    """One row per cell and metric (long format). ``bootstrap`` covers the SUMMARISED_METRICS per cell."""
    metrics = list(SUMMARISED_METRICS)
    stats = describe(ok_trials, CELL_KEYS, metrics, confidence)
    intervals = pd.concat({metric: bootstrap.interval(metric, confidence) for metric in metrics}, names=["metric"])
    stats = stats.join(intervals.reorder_levels([*CELL_KEYS, "metric"]))
    stats = stats.join(variance_components(ok_trials, CELL_KEYS, "trial", metrics))
    table = stats.reset_index()
    table.insert(table.columns.get_loc("metric") + 1, "description", table["metric"].map(SUMMARISED_METRICS))
    table["n"] = table["n"].astype(int)
    return _with_cell_columns(table, ok_trials)


def convergence_table(ok_trials: pd.DataFrame, confidence: float) -> pd.DataFrame:
    """Per cell: ok trials, how many reached the target (with a Wilson interval), and the
    distribution of epochs-to-target as 'epochs: count' pairs."""
    table = ok_trials.groupby(CELL_KEYS, sort=True).agg(
        ok_trials=("valid", "size"),
        reached_target=("valid", "sum"),
        epochs_to_target_min=("epochs_to_target", "min"),
        epochs_to_target_median=("epochs_to_target", "median"),
        epochs_to_target_max=("epochs_to_target", "max"),
    )
    table["fraction_reached"] = table["reached_target"] / table["ok_trials"]
    table["ci_low"], table["ci_high"] = wilson_interval(table["reached_target"], table["ok_trials"], confidence)
    counts = ok_trials.groupby([*CELL_KEYS, "epochs_to_target"], sort=True).size().reset_index(name="count")
    counts["pair"] = counts["epochs_to_target"].astype(int).astype(str) + ": " + counts["count"].astype(str)
    table["epochs_to_target_counts"] = (
        counts.groupby(CELL_KEYS, sort=True)["pair"].agg(", ".join).reindex(table.index, fill_value="")
    )
    return _with_cell_columns(table.reset_index(), ok_trials)


def _with_cell_columns(table: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """Insert the columns of each cell's coordinates (scale, precision, ...) after the cell keys."""
    cells = trials[[*CELL_KEYS, *CELL_COLUMNS]].drop_duplicates(CELL_KEYS)
    merged = table.merge(cells, on=CELL_KEYS, how="left")
    order = [*CELL_KEYS, *CELL_COLUMNS]
    return merged[order + [c for c in merged.columns if c not in order]]
