"""The alert groups of a stored run (mlcampaign.history.alerts) from its trends: the machine's series scanned once
per set of runs (``machine_changes``: each cell's canaries over its trials, and per system of 3 cells or more its
canaries and the common mode of each judged metric over its cells), and a run's cells' listings, contended trials,
unjudged cells and hosts (``run_alerts``), as ``mlcampaign summary`` and the dashboard list them."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping

import numpy as np
import pandas as pd

from mlcampaign.analysis import detection
from mlcampaign.analysis.detection.settings import verdict_of
from mlcampaign.analysis.frame import CELL_KEYS
from mlcampaign.history.alerts import (
    COMMON_MODE,
    COMMON_MODE_CELLS,
    CanaryRuns,
    CellEvent,
    Contended,
    SeriesChange,
    alert_groups,
    series_changes,
)
from mlcampaign.history.relative import steady_contention
from mlcampaign.plan.canaries import CANARIES, canary_column

# Verdicts of a run's rows and the kind of the listing they show.
_KIND_OF_VERDICT = {"regression": "alarm", "improvement": "alarm", "minor shift": "minor shift"}
_KIND_OF_VERDICT["outlying run"] = "outlying run"
UNJUDGED_COLUMNS = [*CELL_KEYS, "metric", "verdict", "ok_trials", "contended", "detail"]


def machine_changes(
    trials: pd.DataFrame, canaries: pd.DataFrame, changes: pd.DataFrame, settings: detection.DetectionSettings
) -> list[SeriesChange]:
    """Every change listed on the machine's series of a set of runs, with run positions (run_order): for each
    system of COMMON_MODE_CELLS judged cells or more its canaries and the common mode of each judged system metric
    over its cells (alerts.series_changes), for the others each cell's canaries (its trials' values, as a
    metric's: what the alert groups of a system of few cells read)."""
    found: list[SeriesChange] = []
    counts = cells_per_system(changes)
    for name, (system, benchmark, cell), orders, values in _few_cells_canaries(trials, changes):
        series = detection.run_series(values, "log")
        for change in detection.scan(series, CANARIES[name].better, settings).changes:
            found.append(
                SeriesChange.of(change, orders=orders, series=name, system=system, benchmark=benchmark, cell=cell)
            )
    for system, rows in changes.loc[changes["kind"] == "system"].groupby("system"):
        if counts[system] < COMMON_MODE_CELLS:
            continue
        mine = canaries.loc[canaries["system"] == system]
        for name, values in mine.groupby("canary"):
            table = values.pivot_table(
                index="run_order", columns=["benchmark", "cell"], values="value", aggfunc="first"
            )
            for change in series_changes(table.to_numpy(), CANARIES[name].better, settings):
                found.append(SeriesChange.of(change, orders=table.index, series=name, system=system))
        for metric, values in rows.loc[rows["value"] > 0].groupby("metric"):
            table = np.log(
                values.pivot_table(index="run_order", columns=["benchmark", "cell"], values="value", aggfunc="first")
            )
            direction = values["direction"].iloc[0]
            for change in series_changes(table.to_numpy(), direction, settings):
                found.append(
                    SeriesChange.of(change, orders=table.index, series=COMMON_MODE, system=system, metric=metric)
                )
    return found


def canary_runs(trials: pd.DataFrame, changes: pd.DataFrame) -> dict[tuple, dict[str, CanaryRuns]]:
    """(system, benchmark, cell) -> its canaries' runs (run orders, log of the trials' median), for the cells of the
    systems of fewer than COMMON_MODE_CELLS judged cells: what corroborates their changes where no canary listed
    one."""
    found: dict[tuple, dict[str, CanaryRuns]] = {}
    for name, key, orders, values in _few_cells_canaries(trials, changes):
        centres = np.log([np.median(run) for run in values])
        found.setdefault(key, {})[name] = CanaryRuns(CANARIES[name].better, np.asarray(orders), centres)
    return found


def _few_cells_canaries(trials: pd.DataFrame, changes: pd.DataFrame) -> Iterator[tuple[str, tuple, list, list]]:
    """Each canary of each cell of the systems of fewer than COMMON_MODE_CELLS judged cells: (canary, cell key,
    the run orders it was measured in, its trials' values in each)."""
    few = [system for system, count in cells_per_system(changes).items() if count < COMMON_MODE_CELLS]
    for name in CANARIES:
        column = canary_column(name)
        if column not in trials:
            continue
        measured = trials.loc[(trials[column] > 0) & trials["system"].isin(few), ["run_order", *CELL_KEYS, column]]
        for key, rows in measured.groupby(CELL_KEYS, sort=True):
            by_run = rows.groupby("run_order", sort=True)[column]
            yield name, key, [order for order, _ in by_run], [values.to_numpy() for _, values in by_run]


def cells_per_system(changes: pd.DataFrame) -> dict[str, int]:
    """The judged cells of each system over the trends' runs (its changes rows)."""
    return changes.drop_duplicates(CELL_KEYS)["system"].value_counts().to_dict()


def _stack(changes) -> tuple:
    """A row's stack difference as a hashable tuple of (key, before, after)."""
    if not isinstance(changes, list):
        return ()
    return tuple((c["key"], _plain(c["before"]), _plain(c["after"])) for c in changes)


def _plain(value):
    return json.dumps(value) if isinstance(value, list | dict) else value


def _events(rows: pd.DataFrame, found: pd.DataFrame, order: int, position_of: Mapping[str, int]) -> list[CellEvent]:
    """The listings of a run: its rows' listed verdicts (per run, big drop, convergence) and the whole-history
    change points it found."""
    events = []
    for row in rows.to_dict(orient="records"):
        convergence = row["kind"] == "convergence" and row["verdict"] == "regression"
        if (row["verdict"] not in _KIND_OF_VERDICT and not convergence) or row["change_start_run_id"] is None:
            continue
        kind = "convergence" if row["kind"] == "convergence" else _KIND_OF_VERDICT[row["verdict"]]
        start = position_of[row["change_start_run_id"]]
        events.append(_event(row, kind, _direction_verdict(row), start, order, row["source"] or "per run"))
    for row in found.to_dict(orient="records"):
        events.append(_event(row, row["kind"], row["verdict"], position_of[row["run_id"]], order, "history"))
    return events


def _event(row: Mapping, kind: str, direction_verdict: str, start: int, order: int, source: str) -> CellEvent:
    """The CellEvent of a listed row (a verdict's or a whole-history change point's), listed at run ``order``."""
    return CellEvent(
        **{key: row[key] for key in [*CELL_KEYS, "metric"]},
        kind=kind,
        direction_verdict=direction_verdict,
        start=start,
        listed_at=order,
        relative_change=_number(row["relative_change"]),
        ci_low=_number(row["ci_low"]),
        ci_high=_number(row["ci_high"]),
        matters=bool(row["matters"]),
        stack_changes=_stack(row["stack_changes"]),
        source=source,
    )


def _direction_verdict(row: Mapping) -> str:
    """A listed row's direction: its verdict where it is an alarm's, else the sign of its change."""
    if row["verdict"] in detection.ALARMS:
        return row["verdict"]
    if row["kind"] == "convergence" or math.isnan(_number(row["relative_change"])):
        return "regression"
    return verdict_of(row["relative_change"], row["direction"])


def _number(value) -> float:
    return math.nan if value is None or pd.isna(value) else float(value)


def _contended(trials: pd.DataFrame, rows: pd.DataFrame, keep_contended: bool) -> list[Contended]:
    """The cells of a run with contended ok trials, and how they were judged: kept (regression.keep_contended),
    relative (the cell is judged relative to a canary, and their contention was steady), or left out."""
    ok = trials.loc[(trials["status"] == "ok") & trials["contended"].fillna(False).astype(bool)]
    relative = {tuple(key) for key in rows.loc[rows["relative_to"].notna(), CELL_KEYS].to_numpy()}
    steady = steady_contention(ok)
    found = []
    for key, cell_trials in ok.groupby(CELL_KEYS, sort=True):
        judged = "left out"
        if keep_contended:
            judged = "kept"
        elif key in relative and steady.loc[cell_trials.index].any():
            judged = "relative"
        found.append(Contended(*key, len(cell_trials), judged))
    return found


def _hosts(trials: pd.DataFrame) -> dict[tuple[str, int], frozenset]:
    """(system, run position) -> the hosts its trials ran on."""
    if "host" not in trials:
        return {}
    known = trials.dropna(subset=["host"])
    return {
        (system, int(order)): frozenset(hosts)
        for (system, order), hosts in known.groupby(["system", "run_order"])["host"]
    }


def run_alerts(trends, run_id: str, rows: pd.DataFrame, found: pd.DataFrame) -> tuple[list[dict], pd.DataFrame]:
    """The alert groups of run ``run_id`` (its rows of the trends' changes, and the whole-history changes
    ``found`` by it), and its unjudged cells and metrics (UNJUDGED_COLUMNS): ok trials but no value to judge
    (every trial contended and left out, none reached the target)."""
    run_ids = [run["run_id"] for run in trends.runs]
    order = run_ids.index(run_id)
    position_of = {run: position for position, run in enumerate(run_ids)}
    events = _events(rows, found, order, position_of)
    trials = trends.rows_of_run("trials", run_id)
    groups = alert_groups(
        order,
        run_ids,
        events,
        trends.machine_changes(),
        cells_per_system(trends.changes),
        trends.settings.detection,
        contended=_contended(trials, rows, trends.settings.keep_contended),
        hosts=_hosts(trends.trials),
        canary_runs=trends.canary_runs(),
    )
    unjudged = rows.loc[rows["verdict"] == "no value", UNJUDGED_COLUMNS]
    return groups, unjudged
