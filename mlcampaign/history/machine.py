"""The machine's own series: the canaries every trial measured (mlcampaign.plan.canaries), trended like metrics,
per cell and per system.

- ``canary_run_values``: per run, cell and canary, the run value of the cell's canary: the Huber centre of its
  trials' values on the log scale with the cell's pooled within-run spread as its scale, exactly as a metric's
  run value (mlcampaign.analysis.detection.run_values), and the number of trials it summarises. Every trial that
  measured the canary counts, failed or contended ones too: a canary measures the machine as the trial found it,
  which is what a contended trial is judged against.
- ``machine_series``: per system, canary and run, the machine's level: Tukey's median polish of the system's
  table of cells x runs (log run values) into an overall level, an effect per cell (its process layout and
  precision: a 1x2 cell's process has half the cores of a 1x1's) and an effect per run, robust to one cell off
  and to cells missing from some runs. The run effects, centred on their median, are the machine's series (0:
  its typical run; +0.05: 5 % above it on the log scale); ``level`` is that run in the canary's unit for the
  system's median cell.
- ``machine_page``: the dashboard's "machine" section of a system (mlcampaign.history.dashboard): per canary,
  every cell's run values and the machine's level with units, and their run-to-run coefficient of variation.

Records written before the canaries existed have none: their runs have no rows here.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from mlcampaign.analysis.detection import DetectionSettings, as_cv, run_series, run_values
from mlcampaign.analysis.frame import CELL_KEYS
from mlcampaign.analysis.units import quantity
from mlcampaign.plan.canaries import CANARIES, canary_column

RUN_KEYS = ["run_order", "run_id"]
CELL_VALUE_COLUMNS = [*RUN_KEYS, *CELL_KEYS, "canary", "unit", "n", "value", "level"]
MACHINE_COLUMNS = [*RUN_KEYS, "system", "canary", "unit", "cells", "value", "level"]
POLISH_SWEEPS = 10


def canary_run_values(trials: pd.DataFrame, settings: DetectionSettings | None = None) -> pd.DataFrame:
    """One row per (run, cell, canary) in which a trial of the cell measured the canary (CELL_VALUE_COLUMNS):
    ``n`` trials, ``value`` their Huber run value on the log scale, ``level`` exp(value) in the canary's
    ``unit``. ``trials``: the planned trials of the runs with run_order and run_id (mlcampaign.history.merge
    .trials_by_run); a frame without canary columns (built elsewhere) has no rows."""
    settings = settings or DetectionSettings()
    rows = []
    for name, canary in CANARIES.items():
        column = canary_column(name)
        if column not in trials:
            continue
        measured = trials.loc[trials[column] > 0, [*RUN_KEYS, *CELL_KEYS, column]]
        for cell, cell_trials in measured.groupby(CELL_KEYS, sort=True):
            by_run = list(cell_trials.groupby(RUN_KEYS, sort=True)[column])
            values = run_values(run_series([run_trials.to_numpy() for _, run_trials in by_run], "log"), settings)
            for ((order, run_id), run_trials), value in zip(by_run, values, strict=True):
                rows.append((order, run_id, *cell, name, canary.unit, len(run_trials), value, math.exp(value)))
    return pd.DataFrame(rows, columns=CELL_VALUE_COLUMNS)


def median_polish(table: np.ndarray, sweeps: int = POLISH_SWEEPS) -> tuple[float, np.ndarray, np.ndarray]:
    """Tukey's median polish of ``table`` (rows x columns, NaN where missing): (overall, row effects, column
    effects) with table ~ overall + row + column, the effects centred on their medians."""
    residual = np.array(table, dtype=float)
    rows, columns, overall = np.zeros(residual.shape[0]), np.zeros(residual.shape[1]), 0.0
    for _ in range(sweeps):
        row_medians = np.nanmedian(residual, axis=1)
        residual -= row_medians[:, None]
        rows += row_medians
        shift = np.median(columns)
        columns -= shift
        overall += shift
        column_medians = np.nanmedian(residual, axis=0)
        residual -= column_medians[None, :]
        columns += column_medians
        shift = np.median(rows)
        rows -= shift
        overall += shift
    shift = np.median(columns)
    return overall + shift, rows, columns - shift


def machine_series(cell_values: pd.DataFrame) -> pd.DataFrame:
    """One row per (system, canary, run) in which a cell of the system measured the canary (MACHINE_COLUMNS):
    ``cells`` that did, ``value`` the machine's run effect on the log scale (0: its typical run), ``level`` the
    system's median cell in that run, in the canary's ``unit`` (module docstring)."""
    rows = []
    for (system, name), values in cell_values.groupby(["system", "canary"], sort=True):
        table = values.pivot_table(index=["benchmark", "cell"], columns=RUN_KEYS, values="value", aggfunc="first")
        overall, _, runs = median_polish(table.to_numpy())
        cells = table.notna().sum(axis=0).to_numpy()
        for (order, run_id), effect, count in zip(table.columns, runs, cells, strict=True):
            rows.append(
                (order, run_id, system, name, CANARIES[name].unit, int(count), effect, math.exp(overall + effect))
            )
    return pd.DataFrame(rows, columns=MACHINE_COLUMNS).sort_values(["system", "canary", "run_order"], ignore_index=True)


def run_to_run_cv(log_values: pd.Series) -> float | None:
    """The coefficient of variation between runs of log-scale run values (None below two runs)."""
    return as_cv(float(np.std(log_values, ddof=1)), "log") if len(log_values) > 1 else None


def machine_page(cell_values: pd.DataFrame, machine: pd.DataFrame, system: str) -> list[dict]:
    """The "machine" section of ``system``'s dashboard page: per canary it has values of, its label and unit,
    the machine's series (run ids, level, its text in human units, cells, run-to-run CV) and each cell's (run
    ids, level, text, run-to-run CV)."""
    sections = []
    for name, canary in CANARIES.items():
        series = machine.loc[(machine["system"] == system) & (machine["canary"] == name)]
        if series.empty:
            continue
        cells = []
        mine = cell_values.loc[(cell_values["system"] == system) & (cell_values["canary"] == name)]
        for (benchmark, cell), rows in mine.sort_values("run_order").groupby(["benchmark", "cell"], sort=True):
            cells.append(_series(f"{benchmark} {cell}", rows, canary.unit) | {"n": rows["n"].tolist()})
        machine_entry = _series("machine (median polish over its cells)", series, canary.unit)
        sections.append(
            {
                "canary": name,
                "label": f"{canary.description} ({canary.unit})",
                "unit": canary.unit,
                "machine": machine_entry | {"cells": series["cells"].tolist()},
                "cells": cells,
            }
        )
    return sections


def _series(name: str, rows: pd.DataFrame, unit: str) -> dict:
    return {
        "name": name,
        "run_id": rows["run_id"].tolist(),
        "level": rows["level"].tolist(),
        "text": [quantity(level, unit) for level in rows["level"]],
        "run_cv": run_to_run_cv(rows["value"]),
    }
