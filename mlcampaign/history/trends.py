"""Trends of every cell over runs, the runs in which a metric changed, and what changed with it.

Per cell (system x benchmark x cell) and metric (mlcampaign.plan.metrics.COMPARABLE_METRICS, with its
better direction) the series over the runs that ran the cell, in run start order. Each point: n,
mean, median, std, min, max of the run's ok trials and the t interval of the mean
(mlcampaign.analysis.stats.describe, as in the repeatability table).

Change detection reuses the regression comparison (compare_samples: two-sided Mann-Whitney and
the ratio of medians with its bootstrap interval, direction-aware, with the campaign's Thresholds):

- consecutive: each run against the previous run that measured the metric in that cell. A change
  *started* in the run whose values differ significantly from the run before it; a run in which
  the cell has no ok trial at all is "not measured".
- baseline (optional): each run against the accepted baseline (rows of
  mlcampaign.analysis.baseline.current); ``since_run_id``: the first run of the unbroken series of
  runs with the same verdict.

compare_samples computes a bootstrap interval and a test for every pair it is given (about 2 ms);
a year of weekly runs of 200 cells has 50 000 pairs per metric. Pairs whose verdict is decided
before its interval matters get it here, with compare_samples' reasons, in compare_samples'
order: too few values, a p-value floor at or above alpha, or a median of 0 ("insufficient
samples"); a ratio of medians within min_relative_change ("unchanged", not tested); a Mann-Whitney
p-value at or above alpha, computed by the same scipy test vectorised over the pairs ("unchanged",
with its p-value). Those rows have no ratio interval; every other pair (the candidates for a
change) goes to compare_samples itself.

Beside each consecutive change: what differs between the two runs' records of that cell in their
flattened provenance, system, benchmark, dataset and distributed blocks, and in the runs' system
and benchmark configs and workflow commit (``stack_changes``). Per-trial noise is left out: the
keys of NOISE_KEYS, and any key whose value differs between the trials of one cell in one run.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import json
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import scipy.stats

from mlcampaign.analysis.frame import CELL_KEYS, NOT_RUN
from mlcampaign.analysis.regression import Thresholds, compare_samples, smallest_p_value
from mlcampaign.analysis.stats import describe, group_rng
from mlcampaign.history.merge import AnalysisSettings, records_by_run, runs_in_order, trials_by_run
from mlcampaign.plan.metrics import COMPARABLE_METRICS

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
# Verdicts worth listing as a change of a run (the others say nothing happened or cannot tell).
CHANGE_VERDICTS = ("regression", "improvement", "not measured")
_COMPARISON_COLUMNS = ["verdict", "ratio", "ratio_ci_low", "ratio_ci_high", "p_value", "detail"]
_PAIR_COLUMNS = [*POINT_KEYS, "metric", "direction", "ok_trials", "n_new", "n_old", "median_new", "median_old"]


@dataclasses.dataclass
class Trends:
    """The trends of a set of runs (``compute_trends``).

    ``runs``: the manifests in start order; ``trials``: every run's planned trials with their
    outcomes (merge.trials_by_run); ``points``: one row per run, cell and metric; ``changes``: one
    row per run, cell and metric against the cell's previous measured run; ``baseline``: one row
    per run, cell and metric against the accepted baseline (None without a baseline);
    ``fingerprints``: run id -> system -> flattened stack key -> its distinct values in that run.
    """

    runs: list[Mapping]
    trials: pd.DataFrame
    points: pd.DataFrame
    changes: pd.DataFrame
    baseline: pd.DataFrame | None
    fingerprints: dict[str, dict[str, dict[str, list]]]
    _run_rows: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def rows_of_run(self, table: str, run_id: str) -> pd.DataFrame:
        """The rows of ``table`` ("trials", "changes" or "baseline") of run ``run_id`` (grouped once
        per table: a summary of every run would otherwise scan every table once per run)."""
        frame = getattr(self, table)
        if table not in self._run_rows:
            self._run_rows[table] = frame.groupby("run_id", sort=False).indices
        return frame.iloc[self._run_rows[table].get(run_id, [])]


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


def trend_points(trials: pd.DataFrame, metrics: Sequence[str], confidence: float) -> pd.DataFrame:
    """One row per (run, cell, metric) for every run that ran the cell: ``ok_trials`` of the cell
    in the run, then n (values of the metric), mean, median, std, min, max and the t interval of
    the mean (``ci_low``, ``ci_high``; NaN where n < 2). The t interval rather than the bootstrap:
    a percentile bootstrap of 3-5 trials covers less than its nominal level."""
    ok = trials.loc[trials["status"] == "ok"]
    stats = describe(ok, POINT_KEYS, metrics, confidence).reset_index()
    stats = stats.rename(columns={"ci_t_low": "ci_low", "ci_t_high": "ci_high"})
    cells = (trials["status"] == "ok").groupby([trials[key] for key in POINT_KEYS]).sum().rename("ok_trials")
    grid = cells.reset_index().merge(_directions(trials, metrics), on=CELL_KEYS)
    points = grid.merge(stats, on=[*POINT_KEYS, "metric"], how="left")
    points["n"] = points["n"].fillna(0).astype(int)
    columns = [*POINT_KEYS, "metric", "direction", "ok_trials", "n", "mean", "median", "std", "min", "max"]
    points = points[[*columns, "ci_low", "ci_high"]]
    return points.sort_values([*CELL_KEYS, "metric", "run_order"]).reset_index(drop=True)


def _decided_without_test(n_new: int, n_old: int, median_new: float, median_old: float, thresholds: Thresholds):
    """The verdict, reason and ratio of medians of a pair that compare_samples would not call a
    change whatever its test says (None if only the test can decide), checked in compare_samples'
    order."""
    if min(n_new, n_old) < thresholds.min_trials:
        return "insufficient samples", f"{n_new} vs {n_old} values; min_trials is {thresholds.min_trials}", np.nan
    if median_old == 0:
        return "insufficient samples", "earlier median is 0: no ratio", np.nan
    ratio = median_new / median_old
    floor = smallest_p_value(n_new, n_old)
    if floor >= thresholds.alpha:
        detail = (
            f"{n_new} vs {n_old} values: the smallest possible Mann-Whitney p-value is {floor:.3g}, "
            f"not below alpha {thresholds.alpha:g}; run more trials"
        )
        return "insufficient samples", detail, ratio
    if abs(ratio - 1) < thresholds.min_relative_change:
        detail = f"median {ratio - 1:+.1%} within +/-{thresholds.min_relative_change:.0%} (not tested)"
        return "unchanged", detail, ratio
    return None


def _mann_whitney_p_values(samples: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """The two-sided Mann-Whitney p-value of each pair, as compare_samples' own call computes it:
    one vectorised call per sample sizes and presence of ties, because scipy chooses the exact or
    the asymptotic method once per call from those."""
    p_values = np.empty(len(samples))
    groups: dict[tuple, list[int]] = {}
    for position, (new, old) in enumerate(samples):
        ties = len(np.unique(np.concatenate([new, old]))) < len(new) + len(old)
        groups.setdefault((len(new), len(old), ties), []).append(position)
    for positions in groups.values():
        new = np.stack([samples[position][0] for position in positions])
        old = np.stack([samples[position][1] for position in positions])
        p_values[positions] = scipy.stats.mannwhitneyu(new, old, alternative="two-sided", axis=1).pvalue
    return p_values


class _Samples:
    """The values of each metric of each group of ``table`` (the ok trials of a cell in one run, or
    the baseline's), found by a pair row's ``keys`` (default: ``by``)."""

    def __init__(self, table: pd.DataFrame, by: Sequence[str], metrics: Sequence[str], keys: Sequence[str] = ()):
        self._values = table[list(metrics)].to_numpy(dtype=float)
        self._columns = {metric: position for position, metric in enumerate(metrics)}
        self._rows = table.groupby(list(by), sort=False).indices
        self._keys = tuple(keys or by)

    def of(self, row) -> np.ndarray:
        return self._values[self._rows[tuple(getattr(row, key) for key in self._keys)], self._columns[row.metric]]


def _compare_pairs(
    pairs: pd.DataFrame, new: _Samples, old: _Samples, thresholds: Thresholds, seed: int
) -> pd.DataFrame:
    """``pairs`` with the comparison columns (module docstring: which pairs compare_samples
    sees). Each row has n_new, n_old, median_new, median_old, metric, direction, run_id and the
    cell keys; ``new`` and ``old`` find the two samples of the row's metric."""
    results: list[dict | None] = []
    undecided = []
    for position, row in enumerate(pairs.itertuples(index=False)):
        decided = _decided_without_test(row.n_new, row.n_old, row.median_new, row.median_old, thresholds)
        results.append(None if decided is None else dict(zip(("verdict", "detail", "ratio"), decided, strict=True)))
        if decided is None:
            new_values, old_values = new.of(row), old.of(row)
            undecided.append((position, row, new_values[~np.isnan(new_values)], old_values[~np.isnan(old_values)]))
    p_values = _mann_whitney_p_values([(new, old) for _, _, new, old in undecided])
    for (position, row, new, old), p_value in zip(undecided, p_values, strict=True):
        if p_value >= thresholds.alpha:
            ratio = row.median_new / row.median_old
            detail = f"median {ratio - 1:+.1%}, p = {p_value:.3g} not below alpha {thresholds.alpha:g}"
            results[position] = {"verdict": "unchanged", "ratio": ratio, "p_value": p_value, "detail": detail}
            continue
        rng = group_rng(seed, (row.run_id, row.system, row.benchmark, row.cell, row.metric))
        result = compare_samples(new, old, row.direction == "higher", thresholds, rng)
        results[position] = {column: result[column] for column in _COMPARISON_COLUMNS}
    comparisons = pd.DataFrame(results, columns=_COMPARISON_COLUMNS, index=pairs.index)
    return pd.concat([pairs, comparisons], axis=1)


def _verdicts(pairs: pd.DataFrame, new: _Samples, old: _Samples, thresholds: Thresholds, seed: int) -> pd.DataFrame:
    """Every pair's verdict, sorted by cell, metric and run: "not measured" where the run has no ok
    trial of the cell, else _compare_pairs."""
    missing = pairs["ok_trials"] == 0
    tested = _compare_pairs(pairs.loc[~missing], new, old, thresholds, seed)
    not_measured = pairs.loc[missing].assign(verdict="not measured", detail="no ok trial of the cell in this run")
    table = pd.concat([tested, not_measured]).reindex(columns=[*pairs.columns, *_COMPARISON_COLUMNS])
    return table.sort_values([*CELL_KEYS, "metric", "run_order"]).reset_index(drop=True)


def consecutive_changes(
    trials: pd.DataFrame, points: pd.DataFrame, metrics: Sequence[str], thresholds: Thresholds, seed: int
) -> pd.DataFrame:
    """One row per (run, cell, metric) with a previous run that measured the metric in the cell:
    ``previous_run_id`` and the comparison; runs in which the cell has no ok trial after one that
    had are "not measured"."""
    series = points.sort_values([*CELL_KEYS, "metric", "run_order"]).copy()
    measured = series["run_id"].where(series["n"] > 0)
    series["previous_run_id"] = measured.groupby([series[key] for key in [*CELL_KEYS, "metric"]]).shift(1)
    series["previous_run_id"] = series.groupby([*CELL_KEYS, "metric"])["previous_run_id"].ffill()
    previous = series[["run_id", *CELL_KEYS, "metric", "n", "median"]].rename(
        columns={"run_id": "previous_run_id", "n": "n_old", "median": "median_old"}
    )
    pairs = series.dropna(subset=["previous_run_id"]).merge(previous, on=["previous_run_id", *CELL_KEYS, "metric"])
    pairs = pairs.rename(columns={"n": "n_new", "median": "median_new"})[[*_PAIR_COLUMNS, "previous_run_id"]]
    ok = trials.loc[trials["status"] == "ok"]
    new = _Samples(ok, ["run_id", *CELL_KEYS], metrics)
    old = _Samples(ok, ["run_id", *CELL_KEYS], metrics, keys=["previous_run_id", *CELL_KEYS])
    return _verdicts(pairs, new, old, thresholds, seed)


def baseline_changes(
    trials: pd.DataFrame,
    points: pd.DataFrame,
    baseline: pd.DataFrame,
    metrics: Sequence[str],
    thresholds: Thresholds,
    seed: int,
) -> pd.DataFrame:
    """One row per (run, cell, metric) of a cell the baseline has: the comparison with the
    accepted samples, and ``since_run_id`` (first run of the unbroken run of the same verdict)."""
    missing_columns = [column for column in [*CELL_KEYS, *metrics] if column not in baseline.columns]
    if missing_columns:
        raise ValueError(f"baseline rows lack columns {missing_columns} (rows of mlcampaign.analysis.baseline.current)")
    described = describe(baseline, CELL_KEYS, metrics, thresholds.confidence)[["n", "median"]].reset_index()
    described = described.rename(columns={"n": "n_old", "median": "median_old"})
    pairs = points.merge(described, on=[*CELL_KEYS, "metric"]).rename(columns={"n": "n_new", "median": "median_new"})
    new = _Samples(trials.loc[trials["status"] == "ok"], ["run_id", *CELL_KEYS], metrics)
    table = _verdicts(pairs[_PAIR_COLUMNS], new, _Samples(baseline, CELL_KEYS, metrics), thresholds, seed)
    streak = (table["verdict"] != table.groupby([*CELL_KEYS, "metric"])["verdict"].shift()).cumsum()
    table["since_run_id"] = table.groupby(streak)["run_id"].transform("first")
    return table


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
    metrics: Sequence[str] = tuple(COMPARABLE_METRICS),
    baseline: pd.DataFrame | None = None,
) -> Trends:
    """The Trends of ``runs`` (manifests; any order) from their ``records`` (flat with ``run.id``,
    or a mapping run id -> records); ``baseline``: the current rows of the baseline store
    (mlcampaign.analysis.baseline.current), optional."""
    unknown = [metric for metric in metrics if metric not in COMPARABLE_METRICS]
    if unknown:
        raise ValueError(f"metrics {unknown} unknown; known: {list(COMPARABLE_METRICS)}")
    runs = runs_in_order(runs)
    by_run = records_by_run(runs, records)
    trials = trials_by_run(runs, by_run)
    points = trend_points(trials, metrics, settings.confidence)
    changes = consecutive_changes(trials, points, metrics, settings.thresholds, settings.seed)
    fingerprints = cell_fingerprints(runs, by_run)
    changes["stack_changes"] = [
        stack_diff(
            fingerprints.get((row.previous_run_id, row.system, row.benchmark, row.cell), {}),
            fingerprints.get((row.run_id, row.system, row.benchmark, row.cell), {}),
        )
        if row.verdict in CHANGE_VERDICTS
        else None
        for row in changes.itertuples()
    ]
    against_baseline = None
    if baseline is not None:
        against_baseline = baseline_changes(trials, points, baseline, metrics, settings.thresholds, settings.seed)
    return Trends(runs, trials, points, changes, against_baseline, system_fingerprints(fingerprints))


_SUMMARY_CHANGE_COLUMNS = [*CELL_KEYS, "metric", "direction", *_COMPARISON_COLUMNS, "n_new", "n_old"]


def _cell_count(rows: pd.DataFrame) -> int:
    return len(rows[CELL_KEYS].drop_duplicates())


def run_summary(trends: Trends, run_id: str) -> dict:
    """What one run came to, as plain JSON-ready data for cron jobs and CI. Keys:

    - ``run_id``, ``campaign``, ``site``, ``started_utc``: from the run's manifest;
    - ``trials``: ``planned`` (the run's own trials, ``at_site``), ``ok``, ``failed``, ``not_run``
      (no record), counted by each trial's current record;
    - ``changes``: the cells and metrics whose verdict against the previous run that measured
      them is a regression, an improvement or "not measured" (CHANGE_VERDICTS), each with
      ``system, benchmark, cell, metric, direction, verdict, ratio`` (this run / previous, of the
      medians), ``ratio_ci_low, ratio_ci_high, p_value`` (null where not tested), ``n_new, n_old``
      (values compared), ``detail`` (why), ``previous_run_id`` and ``stack_changes``
      (``[{key, before, after}]``: what differs in the stack between the two runs);
    - ``baseline``: null without a baseline; else the cells and metrics of this run whose verdict
      against the accepted baseline is in CHANGE_VERDICTS, with the same fields as ``changes``
      and ``since_run_id`` (the first run of the series of runs with that verdict) instead of the
      previous run and stack changes;
    - ``counts``: ``regressions``, ``improvements`` (cell and metric pairs of ``changes``),
      ``not_measured`` (cells of ``changes`` without an ok trial), ``baseline_regressions`` and
      ``baseline_not_measured`` (the same against the baseline; null without a baseline).
    """
    manifest = next((run for run in trends.runs if run["run_id"] == run_id), None)
    if manifest is None:
        raise ValueError(f"run {run_id!r} is not among the trends' runs {[run['run_id'] for run in trends.runs]}")
    trials = trends.rows_of_run("trials", run_id)["status"]
    changes = trends.rows_of_run("changes", run_id)
    changes = changes.loc[changes["verdict"].isin(CHANGE_VERDICTS)]
    # pandas' JSON writer: NaN as null, numpy numbers as plain ones.
    listed = json.loads(
        changes[[*_SUMMARY_CHANGE_COLUMNS, "previous_run_id", "stack_changes"]].to_json(orient="records")
    )
    verdicts = changes["verdict"].value_counts()
    summary = {
        "run_id": run_id,
        "campaign": manifest["campaign"],
        "site": manifest["site"],
        "started_utc": manifest["started_utc"],
        "trials": {
            "planned": len(trials),
            "ok": int((trials == "ok").sum()),
            "failed": int((trials == "failed").sum()),
            "not_run": int((trials == NOT_RUN).sum()),
        },
        "changes": listed,
        "baseline": None,
        "counts": {
            "regressions": int(verdicts.get("regression", 0)),
            "improvements": int(verdicts.get("improvement", 0)),
            "not_measured": _cell_count(changes.loc[changes["verdict"] == "not measured"]),
            "baseline_regressions": None,
            "baseline_not_measured": None,
        },
    }
    if trends.baseline is not None:
        against = trends.rows_of_run("baseline", run_id)
        against = against.loc[against["verdict"].isin(CHANGE_VERDICTS)]
        summary["baseline"] = json.loads(against[[*_SUMMARY_CHANGE_COLUMNS, "since_run_id"]].to_json(orient="records"))
        summary["counts"]["baseline_regressions"] = int((against["verdict"] == "regression").sum())
        summary["counts"]["baseline_not_measured"] = _cell_count(against.loc[against["verdict"] == "not measured"])
    return summary
