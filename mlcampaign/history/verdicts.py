"""The verdicts of every judged cell and metric at every run (``judge``), from the change detectors of
mlcampaign.analysis.detection (the run is the unit; mlcampaign.history.trends says which detector judges
which metric), with what changed in the stack beside each change (mlcampaign.history.stack_changes)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from mlcampaign.analysis import detection
from mlcampaign.analysis.frame import CELL_KEYS
from mlcampaign.history.merge import AnalysisSettings
from mlcampaign.history.relative import RAW, RelativeChoice, choose, relative_trials, steady_contention
from mlcampaign.history.stack_changes import stack_diff, stack_near
from mlcampaign.history.trend_points import POINT_KEYS
from mlcampaign.plan.canaries import CANARIES, canary_column
from mlcampaign.plan.metrics import CONVERGENCE_METRICS, SPLIT_METRICS

# Verdicts listed as a change of a run (the others say nothing happened, or that the history cannot
# tell yet: those are listed apart). Regressions and improvements are the alarms that matter.
CHANGE_VERDICTS = ("regression", "improvement", "minor shift", "outlying run", "not measured")
# The verdicts of a change the per-run test listed (with the run it started in).
LISTED_VERDICTS = (*detection.ALARMS, "minor shift", "outlying run")
# The evaluation grid of epochs to target: epochs are counted whole.
EPOCH_RESOLUTION = 1.0
CHANGE_COLUMNS = [
    *POINT_KEYS,
    "metric",
    "direction",
    "kind",
    "verdict",
    "matters",
    "source",
    "reason",
    "ok_trials",
    "contended",
    "n",
    "value",
    "change_start_run_id",
    "updates_run_id",
    "previous_run_id",
    "relative_change",
    "ci_low",
    "ci_high",
    "interval_level",
    "p_value",
    "adjusted_p",
    "false_alarm_rate",
    "new_runs",
    "reference_runs",
    "run_cv",
    "within_cv",
    "between_cv",
    "smallest_detectable_first",
    "smallest_detectable",
    "trials_needed",
    "runs_needed",
    "detail",
    "stack_changes",
    "stack_changes_run_id",
    "relative_to",
    "relative_detail",
]
HISTORY_COLUMNS = [*CELL_KEYS, "metric", "direction", "run_id", "previous_run_id", "first_found_run_id", "verdict"]
HISTORY_COLUMNS += ["kind", "matters", "before", "after", "relative_change", "ci_low", "ci_high", "interval_level"]
HISTORY_COLUMNS += ["p_value", "alarmed", "stack_changes", "stack_changes_run_id"]
BASELINE_COLUMNS = [*POINT_KEYS, "metric", "direction", "verdict", "reason", "n", "value", "baseline_value"]
BASELINE_COLUMNS += ["relative_change", "ci_low", "ci_high", "p_value", "smallest_detectable", "detail", "since_run_id"]


def judged_metrics(metrics: Sequence[str]) -> list[str]:
    """The metrics judged for ``metrics``: each split metric (time to train) replaced by its parts."""
    judged = [part for metric in metrics for part in SPLIT_METRICS.get(metric, (metric,))]
    return list(dict.fromkeys(judged))


def kind_of(metric: str) -> str:
    """What a change of ``metric`` is: "convergence" (judged one-sided) or "system"."""
    return "convergence" if metric in CONVERGENCE_METRICS else "system"


@dataclasses.dataclass
class _Cell:
    """One cell and metric over its runs (``points``: its rows of the trends' points as dicts, in run order)."""

    key: tuple  # system, benchmark, cell
    metric: str
    direction: str
    points: list[dict]
    values: list[np.ndarray]  # each run's used trial values (NaN: the trial has no value of the metric)
    # canary -> each run's canary values of those trials (NaN: not measured); the same of the run's contended
    # trials whose contention was steady (relative.steady_contention), judged only where the cell is relative.
    canaries: dict[str, list[np.ndarray]] = dataclasses.field(default_factory=dict)
    steady: list[np.ndarray] = dataclasses.field(default_factory=list)
    steady_canaries: dict[str, list[np.ndarray]] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        self.run_ids = [point["run_id"] for point in self.points]
        self.counts = np.array([point["n"] for point in self.points])

    def base_row(self, position: int) -> dict:
        point = self.points[position]
        row = {key: point[key] for key in POINT_KEYS}
        row |= {"metric": self.metric, "direction": self.direction, "kind": kind_of(self.metric)}
        row |= {"ok_trials": int(point["ok_trials"]), "contended": int(point["contended"]), "n": int(point["n"])}
        return row

    def unmeasured(self, position: int, keep_contended: bool) -> tuple[str, str]:
        """Verdict and detail of a run without a value of the metric."""
        ok_trials, contended = int(self.points[position]["ok_trials"]), int(self.points[position]["contended"])
        if ok_trials == 0:
            return "not measured", "no ok trial of the cell in this run"
        if not keep_contended and contended == ok_trials:
            return (
                "no value",
                f"its {ok_trials} ok trial(s) were contended and are left out (regression.keep_contended)",
            )
        return "no value", f"none of its {ok_trials} used trial(s) has a value of {self.metric}"

    def previous_measured(self, position: int) -> str | None:
        """The run before ``position`` with a value of the metric (the other side of a stack diff)."""
        earlier = np.flatnonzero(self.counts[:position] > 0)
        return self.run_ids[int(earlier[-1])] if len(earlier) else None


def _cells(trials: pd.DataFrame, points: pd.DataFrame, metrics: Sequence[str]) -> Iterable[_Cell]:
    """Every judged cell and metric with its runs' used trial values (``points`` in cell, metric and run
    order, as trend_points sorts them)."""
    used = trials.loc[trials["used"]]
    steady = trials.loc[~trials["used"] & (trials["status"] == "ok") & steady_contention(trials)]
    names = [name for name in CANARIES if canary_column(name) in trials]
    tables = []
    for frame in (used, steady):
        columns = {metric: frame[metric].to_numpy(float) for metric in metrics}
        columns |= {name: frame[canary_column(name)].to_numpy(float) for name in names}
        tables.append((frame.groupby(POINT_KEYS, sort=False).indices, columns))
    judged = points.loc[points["metric"].isin(list(metrics))]
    grouped: dict[tuple, list[dict]] = {}
    for point in judged.to_dict(orient="records"):
        grouped.setdefault((point["system"], point["benchmark"], point["cell"], point["metric"]), []).append(point)
    empty = np.array([], dtype=int)
    for (system, benchmark, cell, metric), series in grouped.items():
        keys = [(point["run_order"], point["run_id"], system, benchmark, cell) for point in series]
        (used_rows, used_columns), (steady_rows, steady_columns) = tables
        yield _Cell(
            (system, benchmark, cell),
            metric,
            series[0]["direction"],
            series,
            [used_columns[metric][used_rows.get(key, empty)] for key in keys],
            {name: [used_columns[name][used_rows.get(key, empty)] for key in keys] for name in names},
            [steady_columns[metric][steady_rows.get(key, empty)] for key in keys],
            {name: [steady_columns[name][steady_rows.get(key, empty)] for key in keys] for name in names},
        )


def _stack(fingerprints: Mapping, cell: _Cell, start: int, last: int) -> dict:
    """The stack difference of the cell's change starting at run position ``start`` (stack_changes.stack_near: its
    own run's, else a run's next to it), and the run it differs in."""
    system, benchmark, name = cell.key

    def diff_into(position: int) -> list[dict]:
        if not cell.counts[position]:  # a run without the cell's trials has no stack to compare
            return []
        before, after = cell.previous_measured(position), cell.run_ids[position]
        return stack_diff(
            fingerprints.get((before, system, benchmark, name), {}),
            fingerprints.get((after, system, benchmark, name), {}),
        )

    at, diff = stack_near(start, last, diff_into)
    return {"stack_changes": diff, "stack_changes_run_id": cell.run_ids[at] if diff else None}


def _step_row(cell: _Cell, position: int, result: detection.StepResult, scale: str, value: float) -> dict:
    noise = result.noise if scale == "log" else None  # a coefficient of variation only on the log scale
    return cell.base_row(position) | {
        "verdict": result.verdict,
        "matters": result.verdict in detection.ALARMS,
        "source": result.source,
        "reason": result.reason,
        "value": value,
        "change_start_run_id": None if result.change_start is None else cell.run_ids[result.change_start],
        "updates_run_id": None if result.updates is None else cell.run_ids[result.updates],
        "previous_run_id": None,
        "relative_change": result.relative_change,
        "ci_low": result.ci_low,
        "ci_high": result.ci_high,
        "interval_level": result.interval_level,
        "p_value": result.p_value,
        "adjusted_p": result.adjusted_p,
        "false_alarm_rate": result.false_alarm_rate,
        "new_runs": result.new_runs,
        "reference_runs": result.reference_runs,
        "run_cv": detection.as_cv(noise.run_sd, scale) if noise else math.nan,
        "within_cv": detection.as_cv(noise.within_sd, scale) if noise else math.nan,
        "between_cv": detection.as_cv(noise.between_sd, scale) if noise else math.nan,
        "smallest_detectable_first": result.mde_first,
        "smallest_detectable": result.mde_confirmed,
        "trials_needed": result.trials_needed,
        "runs_needed": result.runs_needed,
        "detail": result.detail,
        "stack_changes": None,
        "stack_changes_run_id": None,
    }


def _sign(cell: _Cell, canary: str) -> float:
    """The canary's exponent in a relative value: +1 (divided by it) where the metric and the canary are better
    the same way (throughput and FLOP/s), -1 (times it) where not (time per sample)."""
    return 1.0 if cell.direction == CANARIES[canary].better else -1.0


def _relative_choice(cell: _Cell, settings: AnalysisSettings, runs: int | None = None) -> RelativeChoice:
    """Whether ``cell`` is judged relative to one of its canaries (mlcampaign.history.relative.choose), on its
    first ``runs`` runs (default: all)."""
    canaries = {name: (values[:runs], _sign(cell, name)) for name, values in cell.canaries.items()}
    return choose(cell.values[:runs], canaries, settings.detection)


def _listed_raw_before(
    cell: _Cell, settings: AnalysisSettings, choice: RelativeChoice, raw: detection.RunSeries
) -> tuple[list[detection.CellChange], detection.StepResult] | None:
    """Where the newest run is the first judged relative (``choice``; the run before was judged raw), what the
    earlier runs' summaries listed, judged raw (``raw``), with the raw scan's step at the newest run: (listings,
    step); else None."""
    newest = len(cell.values) - 1
    if choice.canary is None or _relative_choice(cell, settings, newest).canary is not None:
        return None
    scanned = detection.scan(raw, cell.direction, settings.detection)
    listed = [change for change in scanned.changes if change.kind != "outlying run" and change.listed_at < newest]
    return listed, scanned.steps[-1]


def _listed_already(direction_verdict: str, start: int, listed: Sequence[detection.CellChange]) -> bool:
    """Whether a listing of ``listed`` is the same change: the same direction, its start within a run."""
    return any(change.direction_verdict == direction_verdict and abs(change.start - start) <= 1 for change in listed)


def _first_relative_listing(
    cell: _Cell, settings: AnalysisSettings, changes: Sequence[detection.CellChange], listed_raw: Sequence
) -> detection.CellChange | None:
    """At the first run judged relative, the change the relative series lists within the newest run's confirmation
    window and no later listing set aside as an outlying run: listed at the newest run, unless the earlier runs'
    summaries, judged raw, listed it already (``listed_raw``): a change is listed once."""
    window = len(cell.values) - 1 - settings.detection.confirmation
    outlying = {change.updates for change in changes if change.kind == "outlying run"}
    found = [
        change
        for change in changes
        if change.kind != "outlying run" and change.start >= window and change.listed_at not in outlying
    ]
    if not found or _listed_already(found[-1].direction_verdict, found[-1].start, listed_raw):
        return None
    return found[-1]


def _relative_series(cell: _Cell, canary: str) -> detection.RunSeries:
    """The cell's runs relative to ``canary``: its used trials and its contended trials whose contention was
    steady, each over its own canary."""
    values = [np.concatenate(pair) for pair in zip(cell.values, cell.steady, strict=True)]
    canaries = [np.concatenate(pair) for pair in zip(cell.canaries[canary], cell.steady_canaries[canary], strict=True)]
    relative = relative_trials(values, canaries, _sign(cell, canary))
    return detection.run_series([run[np.isfinite(run) & (run > 0)] for run in relative], "log")


def _listed_now(step: detection.StepResult, change: detection.CellChange, choice: RelativeChoice, start_run: str):
    """The newest run's step with ``change`` (listed by the relative series before this run) as its verdict."""
    verdict = change.direction_verdict if change.kind == "alarm" else change.kind
    return dataclasses.replace(
        step,
        verdict=verdict,
        reason=None,
        change_start=change.start,
        relative_change=change.relative_change,
        ci_low=change.ci_low,
        ci_high=change.ci_high,
        interval_level=change.interval_level,
        p_value=change.p_value,
        adjusted_p=change.adjusted_p,
        source=change.source,
        detail=f"{verdict} started in {start_run}, first seen now that the cell is {choice.detail}; {step.detail}",
    )


def _judge_system(
    cell: _Cell, settings: AnalysisSettings, fingerprints: Mapping, baseline: np.ndarray | None
) -> tuple[list[dict], list[dict], list[dict]]:
    """The per-run verdicts, the history change points and the baseline rows of a system metric."""
    present = [values[~np.isnan(values)] for values in cell.values]
    everything = np.concatenate(present) if present else np.array([])
    scale = detection.scale_of(everything)
    series = detection.run_series(present, scale)
    choice = _relative_choice(cell, settings) if scale == "log" else RAW
    judged = series if choice.canary is None else _relative_series(cell, choice.canary)
    scanned = detection.scan(judged, cell.direction, settings.detection)
    results = scanned.steps
    centres = detection.run_values(series, settings.detection)
    switched = _listed_raw_before(cell, settings, choice, series)
    if switched is not None:
        # The first run judged relative: a change is listed once, whether the relative series lists it at this
        # run or listed it earlier (summaries of earlier runs were judged raw).
        listed_raw, raw_step = switched
        newest = results[-1]
        if newest.verdict in LISTED_VERDICTS and newest.verdict != "outlying run":
            if _listed_already(
                detection.verdict_of(newest.relative_change, cell.direction), newest.change_start, listed_raw
            ):
                results[-1] = raw_step
        else:
            first = _first_relative_listing(cell, settings, scanned.changes, listed_raw)
            if first is not None:
                results[-1] = _listed_now(newest, first, choice, cell.run_ids[first.start])
    rows = []
    for position, result in enumerate(results):
        value = detection.to_original(centres[position], scale) if not math.isnan(centres[position]) else math.nan
        row = _step_row(cell, position, result, scale, value)
        row |= {"relative_to": choice.canary, "relative_detail": choice.detail or None}
        if result.verdict == "not measured":
            row["verdict"], row["detail"] = cell.unmeasured(position, settings.keep_contended)
        if result.verdict in LISTED_VERDICTS:
            start = result.change_start
            row["previous_run_id"] = cell.previous_measured(start)
            row |= _stack(fingerprints, cell, start, position)
        rows.append(row)
    history = []
    for change in scanned.history:
        before = cell.previous_measured(change.run)
        kind = detection.change_kind(change.relative_change, change.ci_low, change.ci_high, settings.detection)
        history.append(
            dict(zip(CELL_KEYS, cell.key, strict=True))
            | {
                "metric": cell.metric,
                "direction": cell.direction,
                "run_id": cell.run_ids[change.run],
                "previous_run_id": before,
                "first_found_run_id": cell.run_ids[change.first_found],
                "verdict": change.verdict,
                "kind": kind,
                "matters": kind == "alarm",
                "before": change.before,
                "after": change.after,
                "relative_change": change.relative_change,
                "ci_low": change.ci_low,
                "ci_high": change.ci_high,
                "interval_level": change.interval_level,
                "p_value": change.p_value,
                # The per-run test listed the same change (same direction and start): not listed again.
                "alarmed": change.hidden,
            }
            | _stack(fingerprints, cell, change.run, len(cell.run_ids) - 1)
        )
    against = []
    if baseline is not None:
        noise = None
        for position, result in enumerate(results):
            noise = result.noise or noise  # after a change, the earlier segment's noise until the new one has its own
            upto = detection.RunSeries(series.values[: position + 1], scale)
            compared = detection.reference_test(upto, baseline, noise, cell.direction, settings.detection)
            reference = detection.reference_centre(upto, baseline, settings.detection)
            row = {key: rows[position][key] for key in [*POINT_KEYS, "metric", "direction", "n", "value"]}
            row |= {
                "verdict": compared.verdict,
                "reason": compared.reason,
                "baseline_value": math.nan if math.isnan(reference) else detection.to_original(reference, scale),
                "relative_change": compared.relative_change,
                "ci_low": compared.ci_low,
                "ci_high": compared.ci_high,
                "p_value": compared.p_value,
                "smallest_detectable": compared.mde_confirmed,
                "detail": compared.detail,
            }
            if compared.verdict == "not measured":
                row["verdict"], row["detail"] = rows[position]["verdict"], rows[position]["detail"]
            against.append(row)
    return rows, history, against


def _judge_convergence(cell: _Cell, settings: AnalysisSettings) -> list[dict]:
    """Epochs to target at every run, one-sided against the runs before it in its segment (a
    convergence regression starts a new segment, as a per-run alarm does)."""
    rows = []
    first = 0
    for position, values in enumerate(cell.values):
        row = dict.fromkeys(CHANGE_COLUMNS) | cell.base_row(position)
        row |= {"false_alarm_rate": settings.detection.false_alarm_rate}
        if cell.points[position]["ok_trials"] == 0 or not len(values):
            row["verdict"], row["detail"] = cell.unmeasured(position, settings.keep_contended)
            rows.append(row)
            continue
        result = detection.convergence_test(
            cell.values[first:position], values, dataclasses.replace(settings.detection, scale="log"), EPOCH_RESOLUTION
        )
        row |= {
            "verdict": result.verdict,
            "reason": "insufficient history" if result.verdict == "cannot tell yet" else None,
            "value": result.new_mean,
            "relative_change": result.relative_change,
            "ci_high": result.max_slowdown - 1,
            "p_value": result.p_value,
            "reference_runs": result.reference_runs,
            "runs_needed": max(0, settings.detection.min_reference_runs - result.reference_runs),
            "detail": result.detail,
        }
        row["matters"] = result.verdict == "regression"
        if result.verdict == "regression":
            row["change_start_run_id"] = cell.run_ids[position]
            row["previous_run_id"] = cell.previous_measured(position)
            first = position
        rows.append(row)
    return rows


def _streaks(table: pd.DataFrame) -> pd.Series:
    """The first run of the unbroken series of runs with the same verdict, per cell and metric."""
    streak = (table["verdict"] != table.groupby([*CELL_KEYS, "metric"])["verdict"].shift()).cumsum()
    return table.groupby(streak)["run_id"].transform("first")


def judge(
    trials: pd.DataFrame,
    points: pd.DataFrame,
    settings: AnalysisSettings,
    fingerprints: Mapping,
    baseline: pd.DataFrame | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame | None]:
    """(changes, history, against the baseline) of every judged cell and metric of ``points``."""
    metrics = judged_metrics(settings.metrics)
    accepted = {}
    if baseline is not None:
        missing = [column for column in [*CELL_KEYS, *metrics] if column not in baseline.columns]
        if missing:
            raise ValueError(f"baseline rows lack columns {missing} (rows of mlcampaign.analysis.baseline.current)")
        for key, rows in baseline.groupby(CELL_KEYS, sort=False):
            accepted[key] = rows
    changes, history, against = [], [], []
    for cell in _cells(trials, points, metrics):
        if kind_of(cell.metric) == "convergence":
            changes += _judge_convergence(cell, settings)
            continue
        reference = accepted.get(cell.key)
        values = None if reference is None else reference[cell.metric].to_numpy(float)
        rows, found, compared = _judge_system(cell, settings, fingerprints, values)
        changes += rows
        history += found
        against += compared
    changes_table = pd.DataFrame(changes, columns=CHANGE_COLUMNS)
    history_table = pd.DataFrame(history, columns=HISTORY_COLUMNS)
    baseline_table = None
    if baseline is not None:
        baseline_table = pd.DataFrame(against, columns=BASELINE_COLUMNS[:-1])
        baseline_table = baseline_table.sort_values([*CELL_KEYS, "metric", "run_order"]).reset_index(drop=True)
        baseline_table["since_run_id"] = _streaks(baseline_table)
    return changes_table, history_table, baseline_table
