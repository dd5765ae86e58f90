"""Trends of every cell over runs, the changes detected on them, and what changed in the stack with them.

Per cell (system x benchmark x cell) and metric (the campaign's ``regression.metrics``, each with its
better direction) the series over the runs that ran the cell, in run start order. The run is the unit
(mlcampaign.analysis.detection): each run's used trials (ok, and not contended unless
``regression.keep_contended``) give one point, with n, mean, median, std, min, max and the t interval
of the mean, and the run's value (the Huber centre the detectors read).

Judged per cell and metric, one code path for the summary, the dashboard, ``mlcampaign compare`` and
the regression check:

- system metrics (throughput, time per sample, quality, Valid FLOPS): the per-run test at every run
  (``detection.scan``: verdict, size, interval, stated false-alarm rate, the smallest detectable
  change and the runs or trials per run that the target change needs), and the whole-history change
  points (``detection.history_changes``: the run in which a change started, and the first run whose
  analysis found it);
- convergence metrics (epochs to target): one-sided against the cell's history
  (``detection.convergence_test``), a convergence change, not a system change;
- split metrics (time to train): trended, judged through their parts (time per sample, epochs to
  target);
- against the accepted baseline (optional): each run's value against the baseline's as a reference
  run, with the same run-to-run noise (``detection.reference_test``); ``since_run_id``: the first run
  of the unbroken series of runs with the same verdict.

Beside each change: what differs between the records of that cell in the run where it started and in
the measured run before, in their flattened provenance, system, benchmark, dataset and distributed
blocks, and in the runs' system and benchmark configs and workflow commit (``stack_changes``).
Per-trial noise is left out: the keys of NOISE_KEYS, and any key whose value differs between the
trials of one cell in one run.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import json
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from mlcampaign.analysis import detection
from mlcampaign.analysis.frame import CELL_KEYS, NOT_RUN
from mlcampaign.analysis.stats import describe
from mlcampaign.history.merge import AnalysisSettings, records_by_run, runs_in_order, trials_by_run
from mlcampaign.plan.metrics import COMPARABLE_METRICS, CONVERGENCE_METRICS, SPLIT_METRICS

POINT_KEYS = ["run_order", "run_id", *CELL_KEYS]
# Record blocks that describe how a trial ran (not what it measured).
STACK_BLOCKS = ("provenance", "system", "benchmark", "dataset", "distributed")
# Flattened keys that differ from trial to trial whatever the stack (times, hosts, job ids).
NOISE_KEYS = (
    "provenance.started_utc",
    "provenance.finished_utc",
    "provenance.hostname",
    "provenance.command_line",
    "provenance.scheduler_job_id",
    "provenance.environment.*JOB*ID*",
    "provenance.environment.*NODELIST*",
    "provenance.environment.*STEP_ID",
    "provenance.environment.*TASK_PID",
    "provenance.environment.*PROCID",
    "provenance.environment.MASTER_ADDR",
    "provenance.environment.MASTER_PORT",
    "distributed.ranks",
    "distributed.weights_consistent",
)
# Verdicts listed as a change of a run (the others say nothing happened, or that the history cannot
# tell yet: those are listed apart).
CHANGE_VERDICTS = ("regression", "improvement", "not measured")
# The evaluation grid of epochs to target: epochs are counted whole.
EPOCH_RESOLUTION = 1.0
CHANGE_COLUMNS = [
    *POINT_KEYS,
    "metric",
    "direction",
    "kind",
    "verdict",
    "reason",
    "ok_trials",
    "contended",
    "n",
    "value",
    "change_start_run_id",
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
]
HISTORY_COLUMNS = [*CELL_KEYS, "metric", "direction", "run_id", "previous_run_id", "first_found_run_id", "verdict"]
HISTORY_COLUMNS += ["before", "after", "relative_change", "p_value", "alarmed", "stack_changes"]
BASELINE_COLUMNS = [*POINT_KEYS, "metric", "direction", "verdict", "reason", "n", "value", "baseline_value"]
BASELINE_COLUMNS += ["relative_change", "ci_low", "ci_high", "p_value", "smallest_detectable", "detail", "since_run_id"]


@dataclasses.dataclass
class Trends:
    """The trends of a set of runs (``compute_trends``).

    ``runs``: the manifests in start order; ``trials``: every run's planned trials with their outcomes
    (merge.trials_by_run) and ``used`` (in the trends); ``points``: one row per run, cell and metric;
    ``changes``: one row per run, cell and judged metric (CHANGE_COLUMNS); ``history``: the whole-history
    change points as the analysis of the last run names them (HISTORY_COLUMNS); ``baseline``: one row
    per run, cell and system metric against the accepted baseline (None without a baseline);
    ``fingerprints``: run id -> system -> flattened stack key -> its distinct values in that run.
    """

    runs: list[Mapping]
    trials: pd.DataFrame
    points: pd.DataFrame
    changes: pd.DataFrame
    history: pd.DataFrame
    baseline: pd.DataFrame | None
    fingerprints: dict[str, dict[str, dict[str, list]]]
    settings: AnalysisSettings
    _run_rows: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def first_measured(self) -> dict[tuple, int]:
        """(system, benchmark, cell) -> the order of the first run with an ok trial of it (computed once)."""
        if "first_measured" not in self._run_rows:
            measured = self.points.loc[self.points["ok_trials"] > 0]
            self._run_rows["first_measured"] = measured.groupby(CELL_KEYS)["run_order"].min().to_dict()
        return self._run_rows["first_measured"]

    def rows_of_run(self, table: str, run_id: str) -> pd.DataFrame:
        """The rows of ``table`` ("trials", "changes" or "baseline") of run ``run_id`` (grouped once
        per table: a summary of every run would otherwise scan every table once per run)."""
        frame = getattr(self, table)
        if table not in self._run_rows:
            self._run_rows[table] = frame.groupby("run_id", sort=False).indices
        return frame.iloc[self._run_rows[table].get(run_id, [])]


def judged_metrics(metrics: Sequence[str]) -> list[str]:
    """The metrics judged for ``metrics``: each split metric (time to train) replaced by its parts."""
    judged = [part for metric in metrics for part in SPLIT_METRICS.get(metric, (metric,))]
    return list(dict.fromkeys(judged))


def kind_of(metric: str) -> str:
    """What a change of ``metric`` is: "convergence" (judged one-sided) or "system"."""
    return "convergence" if metric in CONVERGENCE_METRICS else "system"


def _directions(trials: pd.DataFrame, metrics: Sequence[str]) -> pd.DataFrame:
    """Per cell and metric, which way is better ("target": the cell's records' target direction)."""
    targets = trials.dropna(subset=["target_direction"]).groupby(CELL_KEYS)["target_direction"].first()
    cells = trials[CELL_KEYS].drop_duplicates().merge(targets.reset_index(), on=CELL_KEYS, how="left")
    rows = []
    for metric in metrics:
        direction = COMPARABLE_METRICS[metric]
        rows.append(
            cells.assign(metric=metric, direction=cells["target_direction"] if direction == "target" else direction)
        )
    return pd.concat(rows, ignore_index=True).drop(columns="target_direction")


def used_trials(trials: pd.DataFrame, keep_contended: bool) -> pd.Series:
    """Which planned trials the trends use: ok ones, less those whose timing was disturbed (the
    record's contention.contended) unless ``keep_contended``."""
    used = trials["status"] == "ok"
    return used if keep_contended else used & ~_contended(trials)


def _contended(trials: pd.DataFrame) -> pd.Series:
    return trials["contended"].fillna(False).astype(bool)


def trend_points(trials: pd.DataFrame, metrics: Sequence[str], confidence: float) -> pd.DataFrame:
    """One row per (run, cell, metric) for every run that ran the cell: ``ok_trials`` and ``contended``
    (ok trials whose timing was disturbed) of the cell in the run, then over its used trials
    (``trials["used"]``) n (values of the metric), mean, median, std, min, max and the t interval of
    the mean (``ci_low``, ``ci_high``; NaN where n < 2). The t interval rather than the bootstrap: a
    percentile bootstrap of 3-5 trials covers less than its nominal level."""
    stats = describe(trials.loc[trials["used"]], POINT_KEYS, metrics, confidence).reset_index()
    stats = stats.rename(columns={"ci_t_low": "ci_low", "ci_t_high": "ci_high"})
    ok = trials["status"] == "ok"
    groups = [trials[key] for key in POINT_KEYS]
    counts = pd.concat(
        {"ok_trials": ok.groupby(groups).sum(), "contended": (ok & _contended(trials)).groupby(groups).sum()}, axis=1
    )
    grid = counts.reset_index().merge(_directions(trials, metrics), on=CELL_KEYS)
    points = grid.merge(stats, on=[*POINT_KEYS, "metric"], how="left")
    points["n"] = points["n"].fillna(0).astype(int)
    columns = [*POINT_KEYS, "metric", "direction", "ok_trials", "contended", "n", "mean", "median", "std", "min", "max"]
    points = points[[*columns, "ci_low", "ci_high"]]
    return points.sort_values([*CELL_KEYS, "metric", "run_order"]).reset_index(drop=True)


def _cv(sd: float | None, scale: str) -> float:
    """A run-value sd on the log scale as a coefficient of variation (NaN on the linear scale)."""
    return math.expm1(sd) if scale == "log" and sd is not None and not math.isnan(sd) else math.nan


@dataclasses.dataclass
class _Cell:
    """One cell and metric over its runs (``points``: its rows of the trends' points as dicts, in run order)."""

    key: tuple  # system, benchmark, cell
    metric: str
    direction: str
    points: list[dict]
    values: list[np.ndarray]  # each run's used trial values (NaN: the trial has no value of the metric)

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
    rows = used.groupby(POINT_KEYS, sort=False).indices
    columns = {metric: used[metric].to_numpy(float) for metric in metrics}
    judged = points.loc[points["metric"].isin(list(metrics))]
    grouped: dict[tuple, list[dict]] = {}
    for point in judged.to_dict(orient="records"):
        grouped.setdefault((point["system"], point["benchmark"], point["cell"], point["metric"]), []).append(point)
    empty = np.array([], dtype=int)
    for (system, benchmark, cell, metric), series in grouped.items():
        values = [
            columns[metric][rows.get((point["run_order"], point["run_id"], system, benchmark, cell), empty)]
            for point in series
        ]
        yield _Cell((system, benchmark, cell), metric, series[0]["direction"], series, values)


def _stack(fingerprints: Mapping, cell: _Cell, before: str | None, after: str) -> list[dict]:
    system, benchmark, name = cell.key
    return stack_diff(
        fingerprints.get((before, system, benchmark, name), {}), fingerprints.get((after, system, benchmark, name), {})
    )


def _step_row(cell: _Cell, position: int, result: detection.StepResult, scale: str, value: float) -> dict:
    noise = result.noise
    return cell.base_row(position) | {
        "verdict": result.verdict,
        "reason": result.reason,
        "value": value,
        "change_start_run_id": None if result.change_start is None else cell.run_ids[result.change_start],
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
        "run_cv": _cv(noise.run_sd, scale) if noise else math.nan,
        "within_cv": _cv(noise.within_sd, scale) if noise else math.nan,
        "between_cv": _cv(noise.between_sd, scale) if noise else math.nan,
        "smallest_detectable_first": result.mde_first,
        "smallest_detectable": result.mde_confirmed,
        "trials_needed": result.trials_needed,
        "runs_needed": result.runs_needed,
        "detail": result.detail,
        "stack_changes": None,
    }


def _judge_system(
    cell: _Cell, settings: AnalysisSettings, fingerprints: Mapping, baseline: np.ndarray | None
) -> tuple[list[dict], list[dict], list[dict]]:
    """The per-run verdicts, the history change points and the baseline rows of a system metric."""
    present = [values[~np.isnan(values)] for values in cell.values]
    everything = np.concatenate(present) if present else np.array([])
    scale = detection.scale_of(everything)
    series = detection.run_series(present, scale)
    results = detection.scan(series, cell.direction, settings.detection)
    centres = detection.run_values(series, settings.detection)
    rows = []
    for position, result in enumerate(results):
        value = detection.to_original(centres[position], scale) if not math.isnan(centres[position]) else math.nan
        row = _step_row(cell, position, result, scale, value)
        if result.verdict == "not measured":
            row["verdict"], row["detail"] = cell.unmeasured(position, settings.keep_contended)
        if result.verdict in detection.ALARMS:
            start = result.change_start
            row["previous_run_id"] = cell.previous_measured(start)
            row["stack_changes"] = _stack(fingerprints, cell, row["previous_run_id"], cell.run_ids[start])
        rows.append(row)
    alarmed_starts = [result.change_start for result in results if result.verdict in detection.ALARMS]
    history = []
    for change in detection.history_changes(series, cell.direction, settings.detection):
        before = cell.previous_measured(change.run)
        history.append(
            dict(zip(CELL_KEYS, cell.key, strict=True))
            | {
                "metric": cell.metric,
                "direction": cell.direction,
                "run_id": cell.run_ids[change.run],
                "previous_run_id": before,
                "first_found_run_id": cell.run_ids[change.first_found],
                "verdict": change.verdict,
                "before": change.before,
                "after": change.after,
                "relative_change": change.relative_change,
                "p_value": change.p_value,
                # The per-run test named a start within one run of it: the same change, already alarmed.
                "alarmed": any(abs(start - change.run) <= 1 for start in alarmed_starts),
                "stack_changes": _stack(fingerprints, cell, before, cell.run_ids[change.run]),
            }
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


def _flatten(block: dict, prefix: str, into: dict) -> None:
    """A JSON object's values under dotted keys, nested objects flattened too; lists as JSON text
    (hashable, comparable)."""
    for key, value in block.items():
        name = f"{prefix}.{key}"
        if isinstance(value, dict):
            _flatten(value, name, into)
        else:
            into[name] = json.dumps(value) if isinstance(value, list) else value


@functools.cache
def _is_noise(key: str) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in NOISE_KEYS)


def cell_fingerprints(runs: Sequence[Mapping], by_run: Mapping[str, Sequence[Mapping]]) -> dict[tuple, dict]:
    """(run id, system, benchmark, cell) -> flattened stack key -> value, per-trial noise left out
    (module docstring); ``by_run``: the current records of each run (merge.records_by_run)."""
    cells: dict[tuple, list[dict]] = {}
    for run_id, records in by_run.items():
        for record in records:
            flat: dict = {}
            for block in STACK_BLOCKS:
                _flatten(record[block], block, flat)
            trial = record["trial"]
            key = (run_id, trial["system"], trial["benchmark"], trial["cell"])
            cells.setdefault(key, []).append({name: value for name, value in flat.items() if not _is_noise(name)})
    absent = object()  # a key that some trials of a cell have and others lack varies too
    varying = set()
    for first, *others in cells.values():
        for other in others:
            if other != first:
                varying.update(
                    key for key in first.keys() | other.keys() if first.get(key, absent) != other.get(key, absent)
                )
    manifests = {manifest["run_id"]: manifest for manifest in runs}
    fingerprints = {}
    for (run_id, system, benchmark, cell), (first, *_) in cells.items():
        fingerprint = {key: value for key, value in first.items() if key not in varying}
        manifest = manifests[run_id]
        fingerprint["run.workflow_commit"] = manifest.get("workflow_commit")
        _flatten(manifest.get("systems", {}).get(system, {}), "system_config", fingerprint)
        _flatten(manifest["benchmarks"].get(benchmark, {}), f"benchmark_config.{benchmark}", fingerprint)
        fingerprints[(run_id, system, benchmark, cell)] = fingerprint
    return fingerprints


def system_fingerprints(cells: Mapping[tuple, Mapping]) -> dict[str, dict[str, dict[str, list]]]:
    """run id -> system -> key -> the distinct values of the key over the system's cells (sorted
    as text), from ``cell_fingerprints``."""
    systems: dict[str, dict[str, dict[str, set]]] = {}
    for (run_id, system, _, _), fingerprint in cells.items():
        keys = systems.setdefault(run_id, {}).setdefault(system, {})
        for key, value in fingerprint.items():
            keys.setdefault(key, set()).add(value)
    return {
        run_id: {
            system: {key: sorted(seen, key=str) for key, seen in sorted(keys.items())} for system, keys in found.items()
        }
        for run_id, found in systems.items()
    }


def stack_diff(before: Mapping, after: Mapping) -> list[dict]:
    """The keys whose value differs, sorted: ``{"key", "before", "after"}`` (None: absent or null)."""
    return [
        {"key": key, "before": before.get(key), "after": after.get(key)}
        for key in sorted(before.keys() | after.keys())
        if before.get(key) != after.get(key)
    ]


def compute_trends(
    runs: Sequence[Mapping],
    records: Iterable[Mapping] | Mapping[str, Iterable[Mapping]],
    settings: AnalysisSettings,
    *,
    baseline: pd.DataFrame | None = None,
) -> Trends:
    """The Trends of ``runs`` (manifests; any order) from their ``records`` (flat with ``run.id``,
    or a mapping run id -> records), judged as ``settings`` say (the metrics of ``settings.metrics``);
    ``baseline``: the current rows of the baseline store (mlcampaign.analysis.baseline.current),
    optional."""
    unknown = [metric for metric in settings.metrics if metric not in COMPARABLE_METRICS]
    if unknown:
        raise ValueError(f"metrics {unknown} unknown; known: {list(COMPARABLE_METRICS)}")
    runs = runs_in_order(runs)
    by_run = records_by_run(runs, records)
    trials = trials_by_run(runs, by_run)
    trials["used"] = used_trials(trials, settings.keep_contended)
    metrics = list(dict.fromkeys([*settings.metrics, *judged_metrics(settings.metrics)]))
    points = trend_points(trials, metrics, settings.confidence)
    fingerprints = cell_fingerprints(runs, by_run)
    changes, history, against = judge(trials, points, settings, fingerprints, baseline)
    return Trends(runs, trials, points, changes, history, against, system_fingerprints(fingerprints), settings)


def _cell_count(rows: pd.DataFrame) -> int:
    return len(rows[CELL_KEYS].drop_duplicates())


def _records(frame: pd.DataFrame, columns: Sequence[str]) -> list[dict]:
    """Rows as JSON-ready dicts (NaN -> null, numpy numbers -> plain ones) through pandas' JSON writer."""
    return json.loads(frame[list(columns)].to_json(orient="records"))


SUMMARY_CHANGE_COLUMNS = [*CELL_KEYS, "metric", "direction", "kind", "verdict", "change_start_run_id"]
SUMMARY_CHANGE_COLUMNS += ["previous_run_id", "relative_change", "ci_low", "ci_high", "interval_level", "p_value"]
SUMMARY_CHANGE_COLUMNS += ["adjusted_p", "false_alarm_rate", "n", "contended", "detail", "stack_changes"]
SUMMARY_CELL_COLUMNS = [*CELL_KEYS, "metric", "kind", "verdict", "reason", "n", "ok_trials", "contended", "run_cv"]
SUMMARY_CELL_COLUMNS += ["smallest_detectable_first", "smallest_detectable", "trials_needed", "runs_needed", "detail"]
SUMMARY_HISTORY_COLUMNS = [c for c in HISTORY_COLUMNS if c != "alarmed"]
SUMMARY_BASELINE_COLUMNS = [*CELL_KEYS, "metric", "direction", "verdict", "value", "baseline_value"]
SUMMARY_BASELINE_COLUMNS += ["relative_change", "ci_low", "ci_high", "p_value", "n", "detail", "since_run_id"]


def run_summary(trends: Trends, run_id: str) -> dict:
    """What one run came to, as plain JSON-ready data for cron jobs and CI (docs/history.md). Keys:

    - ``run_id``, ``campaign``, ``site``, ``started_utc``: from the run's manifest;
    - ``settings``: the detection settings it was judged with (target change, false-alarm rate, window,
      confirmation, whether contended trials are kept);
    - ``trials``: ``planned`` (the run's own trials), ``ok``, ``failed``, ``not_run`` (no record),
      ``contended`` (ok trials whose timing was disturbed);
    - ``changes``: the cells and metrics whose per-run verdict at this run is a regression, an
      improvement (``kind`` system or convergence) or "not measured" (no ok trial, after a run that
      had some): the run in which the change started, its size with the interval and p-value at the
      stated false-alarm rate, and what changed in the stack since the run before it;
    - ``history_changes``: whole-history change points first found by this run's analysis, each named
      by the run in which it started (a change the per-run test missed when it happened);
    - ``cannot_tell``: the cells and metrics whose history cannot decide yet, with the reason, the
      smallest change detectable with 90 % power, and the runs or trials per run the target change needs;
    - ``cells``: every judged cell and metric at this run with the same detectability figures;
    - ``baseline``: null without a baseline, else the cells and metrics whose verdict against it is in
      CHANGE_VERDICTS, with ``since_run_id`` (the first run of the series of runs with that verdict);
    - ``counts``: ``regressions``, ``improvements`` (system metrics), ``convergence_regressions``,
      ``history_regressions`` and ``history_improvements`` (found later), ``not_measured`` and
      ``cannot_tell`` (cells), ``contended_trials``, ``baseline_regressions`` and
      ``baseline_not_measured`` (null without a baseline).
    """
    manifest = next((run for run in trends.runs if run["run_id"] == run_id), None)
    if manifest is None:
        raise ValueError(f"run {run_id!r} is not among the trends' runs {[run['run_id'] for run in trends.runs]}")
    trials = trends.rows_of_run("trials", run_id)
    status = trials["status"]
    rows = trends.rows_of_run("changes", run_id)
    # "Not measured" is a change only for a cell measured in an earlier run.
    first_measured = pd.MultiIndex.from_frame(rows[CELL_KEYS]).map(trends.first_measured().get)
    before = np.asarray(first_measured.fillna(np.inf), float) < rows["run_order"].to_numpy()
    not_measured = rows.loc[(rows["verdict"] == "not measured").to_numpy() & before]
    alarms = rows.loc[rows["verdict"].isin(detection.ALARMS)]
    listed = pd.concat([alarms, not_measured.drop_duplicates(CELL_KEYS)])
    found = trends.history.loc[(trends.history["first_found_run_id"] == run_id) & ~trends.history["alarmed"]]
    cannot_tell = rows.loc[rows["verdict"] == "cannot tell yet"]
    system = alarms.loc[alarms["kind"] == "system", "verdict"].value_counts()
    detection_settings = trends.settings.detection
    summary = {
        "run_id": run_id,
        "campaign": manifest["campaign"],
        "site": manifest["site"],
        "started_utc": manifest["started_utc"],
        "settings": {
            "target_change": detection_settings.target_change,
            "false_alarm_rate": detection_settings.false_alarm_rate,
            "window": detection_settings.window,
            "confirmation": detection_settings.confirmation,
            "keep_contended": trends.settings.keep_contended,
        },
        "trials": {
            "planned": len(status),
            "ok": int((status == "ok").sum()),
            "failed": int((status == "failed").sum()),
            "not_run": int((status == NOT_RUN).sum()),
            "contended": int(((status == "ok") & _contended(trials)).sum()),
        },
        "changes": _records(listed, SUMMARY_CHANGE_COLUMNS),
        "history_changes": _records(found, SUMMARY_HISTORY_COLUMNS),
        "cannot_tell": _records(cannot_tell, SUMMARY_CELL_COLUMNS),
        "cells": _records(rows, SUMMARY_CELL_COLUMNS),
        "baseline": None,
        "counts": {
            "regressions": int(system.get("regression", 0)),
            "improvements": int(system.get("improvement", 0)),
            "convergence_regressions": int(
                ((alarms["kind"] == "convergence") & (alarms["verdict"] == "regression")).sum()
            ),
            "history_regressions": int((found["verdict"] == "regression").sum()),
            "history_improvements": int((found["verdict"] == "improvement").sum()),
            "not_measured": _cell_count(not_measured),
            "cannot_tell": _cell_count(cannot_tell),
            "contended_trials": int(((status == "ok") & _contended(trials)).sum()),
            "baseline_regressions": None,
            "baseline_not_measured": None,
        },
    }
    if trends.baseline is not None:
        against = trends.rows_of_run("baseline", run_id)
        against = against.loc[against["verdict"].isin(CHANGE_VERDICTS)]
        summary["baseline"] = _records(against, SUMMARY_BASELINE_COLUMNS)
        summary["counts"]["baseline_regressions"] = int((against["verdict"] == "regression").sum())
        summary["counts"]["baseline_not_measured"] = _cell_count(against.loc[against["verdict"] == "not measured"])
    return summary
