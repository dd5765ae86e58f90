"""Strong and weak scaling tables.

A cell's scaling mode is its benchmark's ``training.batch_scaling`` (recorded as
``benchmark.batch_scaling``): strong keeps the global batch fixed across scales, weak the
per-process (local) batch. A scaling series is the cells of one system x benchmark x precision x
gradient compression x framework x backend at the mode's fixed batch size, ordered by processes.
Relative to the cell with the fewest processes p0 (the smallest scale measured in the series):

    speedup    = throughput(p) / throughput(p0)
    efficiency = speedup / (p / p0)

Throughput is in samples/s, so the same two formulas give strong-scaling efficiency (the same
work per step shared by more processes) and weak-scaling efficiency (throughput per process
kept). A series measured at one scale only is its own baseline (speedup and efficiency 1).

Each cell's metrics carry percentile intervals from the cells' bootstrap; speedup and efficiency
intervals come from the ratio of the two cells' resampled means (their trials are resampled
independently). Time split: shares of the measured step time spent waiting for data (io),
computing, and in communication not hidden by compute. Fraction of peak: achieved FLOP/s over the
configured peak of the devices used at the cell's precision; roofline fraction: over the matmul peak
the trials measured (mlcampaign.measure.roofline).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from mlcampaign.analysis.frame import CELL_KEYS
from mlcampaign.analysis.stats import CellBootstrap, percentile_interval

# Which batch size is fixed along a series, per scaling mode.
MODES = {"strong": "global_batch_size", "weak": "local_batch_size"}
THROUGHPUT = "throughput_samples_per_s"
# Per-cell metrics reported with a bootstrap interval (all must be in the CellBootstrap).
CELL_METRICS = [
    THROUGHPUT,
    "io_fraction",
    "compute_fraction",
    "communication_fraction",
    "achieved_flops_per_s",
    "fraction_of_peak",
    "roofline_fraction",
]
_SERIES_DIMENSIONS = ["benchmark", "system", "precision", "compression", "framework", "backend"]
_RELATIVE = ["baseline_processes", "ideal_speedup"] + [
    f"{m}{s}" for m in ("speedup", "efficiency") for s in ("", "_ci_low", "_ci_high")
]
_PER_CELL = [f"{m}{s}" for m in CELL_METRICS for s in ("", "_ci_low", "_ci_high")]


def scaling_table(ok_trials: pd.DataFrame, bootstrap: CellBootstrap, confidence: float, mode: str) -> pd.DataFrame:
    """One row per cell of scaling mode ``mode`` with a throughput measurement."""
    series_keys = [*_SERIES_DIMENSIONS, MODES[mode]]
    columns = ["mode", *series_keys, "series_scales", "cell", "scale", "nodes", "tasks_per_node", "processes"]
    columns += ["n", *[c for c in MODES.values() if c not in series_keys], "devices_used", "peak_flops_per_s"]
    measured = ok_trials.loc[(ok_trials["batch_scaling"] == mode) & ok_trials[THROUGHPUT].notna()]
    if measured.empty:
        return pd.DataFrame(columns=columns + _RELATIVE + _PER_CELL)
    first = [c for c in columns if c in measured.columns and c not in CELL_KEYS and c not in ("n",)]
    cells = measured.groupby(CELL_KEYS, sort=True).agg(
        n=(THROUGHPUT, "size"),
        **{column: (column, "first") for column in first},
        **{metric: (metric, "mean") for metric in CELL_METRICS},
    )
    for metric in CELL_METRICS:
        interval = bootstrap.interval(metric, confidence).reindex(cells.index)
        cells[f"{metric}_ci_low"] = interval["ci_boot_low"].to_numpy()
        cells[f"{metric}_ci_high"] = interval["ci_boot_high"].to_numpy()
    samples = pd.DataFrame(bootstrap.samples(THROUGHPUT), index=bootstrap.keys).reindex(cells.index).to_numpy()

    # Order each series by scale; its first row is the baseline of every row of the series.
    cells["position"] = np.arange(len(cells))
    cells = cells.sort_values([*series_keys, "processes", "nodes"])
    samples = samples[cells.pop("position").to_numpy()]
    series = cells.groupby(series_keys, sort=False)
    cells["series_scales"] = series["processes"].transform("nunique")
    is_baseline = series.cumcount().to_numpy() == 0
    base = np.maximum.accumulate(np.where(is_baseline, np.arange(len(cells)), 0))
    cells["baseline_processes"] = cells["processes"].to_numpy()[base].astype(int)
    cells["ideal_speedup"] = cells["processes"] / cells["baseline_processes"]
    cells["speedup"] = cells[THROUGHPUT] / cells[THROUGHPUT].to_numpy()[base]
    cells["speedup_ci_low"], cells["speedup_ci_high"] = percentile_interval(samples / samples[base], confidence)
    for suffix in ("", "_ci_low", "_ci_high"):
        cells[f"efficiency{suffix}"] = cells[f"speedup{suffix}"] / cells["ideal_speedup"]
    table = cells.reset_index().assign(mode=mode)
    return table[columns + _RELATIVE + _PER_CELL].reset_index(drop=True)


def scaling_tables(ok_trials: pd.DataFrame, bootstrap: CellBootstrap, confidence: float) -> dict[str, pd.DataFrame]:
    """The strong and the weak scaling table (each cell appears in the table of its mode)."""
    return {mode: scaling_table(ok_trials, bootstrap, confidence, mode) for mode in MODES}
