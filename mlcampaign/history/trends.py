"""Trends of every cell over runs, the changes detected on them, and what changed in the stack with them.

Per cell (system x benchmark x cell) and metric (the campaign's ``regression.metrics``, each with its
better direction) the series over the runs that ran the cell, in run start order. The run is the unit
(mlcampaign.analysis.detection): each run's used trials (ok, and not contended unless
``regression.keep_contended``) give one point, with n, mean, median, std, min, max and the t interval
of the mean (mlcampaign.history.trend_points), and the run's value (the Huber centre the detectors read).

Judged per cell and metric (mlcampaign.history.verdicts), one code path for the summary
(mlcampaign.history.summary), the dashboard, ``mlcampaign compare`` and the regression check:

- system metrics (throughput, time per sample, quality, Valid FLOPS): the per-run test at every run
  (``detection.scan``: verdict — an alarm that matters, a minor shift, an outlying run —, size,
  interval, stated false-alarm rate, the smallest detectable change and the runs or trials per run that
  the target change needs), and the whole-history change points (the run in which a change started,
  the first run whose analysis found it, and whether the per-run test had listed it already);
- convergence metrics (epochs to target): one-sided against the cell's history
  (``detection.convergence_test``), a convergence change, not a system change;
- split metrics (time to train): trended, judged through their parts (time per sample, epochs to
  target);
- against the accepted baseline (optional): each run's value against the baseline's as a reference
  run, with the same run-to-run noise (``detection.reference_test``); ``since_run_id``: the first run
  of the unbroken series of runs with the same verdict.

The machine's own series beside them (mlcampaign.history.machine): per run, cell and canary the cell's canary
run value, and per system, canary and run the machine's level, from every trial that measured the canary.

Beside each change: what differs between the records of that cell in the run where it started and in
the measured run before, in their flattened provenance, system, benchmark, dataset and distributed
blocks, and in the runs' system and benchmark configs and workflow commit (``stack_changes``;
mlcampaign.history.stack_changes). Per-trial noise is left out: the keys of NOISE_KEYS, and any key
whose value differs between the trials of one cell in one run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

import pandas as pd

from mlcampaign.analysis.frame import CELL_KEYS
from mlcampaign.history.machine import canary_run_values, machine_series
from mlcampaign.history.merge import AnalysisSettings, records_by_run, runs_in_order, trials_by_run
from mlcampaign.history.run_alerts import canary_runs, machine_changes
from mlcampaign.history.stack_changes import cell_fingerprints, system_fingerprints
from mlcampaign.history.trend_points import trend_points, used_trials
from mlcampaign.history.verdicts import judge, judged_metrics
from mlcampaign.plan.metrics import COMPARABLE_METRICS


@dataclasses.dataclass
class Trends:
    """The trends of a set of runs (``compute_trends``).

    ``runs``: the manifests in start order; ``trials``: every run's planned trials with their outcomes
    (merge.trials_by_run) and ``used`` (in the trends); ``points``: one row per run, cell and metric;
    ``changes``: one row per run, cell and judged metric (verdicts.CHANGE_COLUMNS); ``history``: every whole-history
    change point a run's analysis named, as the first one saw it (verdicts.HISTORY_COLUMNS); ``baseline``: one row
    per run, cell and system metric against the accepted baseline (None without a baseline);
    ``fingerprints``: run id -> system -> flattened stack key -> its distinct values in that run; ``canaries``:
    one row per run, cell and canary (machine.CELL_VALUE_COLUMNS); ``machine``: one row per system, canary and
    run (machine.MACHINE_COLUMNS).
    """

    runs: list[Mapping]
    trials: pd.DataFrame
    points: pd.DataFrame
    changes: pd.DataFrame
    history: pd.DataFrame
    baseline: pd.DataFrame | None
    fingerprints: dict[str, dict[str, dict[str, list]]]
    settings: AnalysisSettings
    canaries: pd.DataFrame
    machine: pd.DataFrame
    _run_rows: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def first_measured(self) -> dict[tuple, int]:
        """(system, benchmark, cell) -> the order of the first run with an ok trial of it (computed once)."""
        if "first_measured" not in self._run_rows:
            measured = self.points.loc[self.points["ok_trials"] > 0]
            self._run_rows["first_measured"] = measured.groupby(CELL_KEYS)["run_order"].min().to_dict()
        return self._run_rows["first_measured"]

    def machine_changes(self) -> list:
        """Every change listed on the machine's series of these runs (run_alerts.machine_changes; computed once)."""
        if "machine_changes" not in self._run_rows:
            found = machine_changes(self.trials, self.canaries, self.changes, self.settings.detection)
            self._run_rows["machine_changes"] = found
        return self._run_rows["machine_changes"]

    def canary_runs(self) -> dict:
        """The canaries' runs of the cells of systems of few cells (run_alerts.canary_runs; computed once)."""
        if "canary_runs" not in self._run_rows:
            self._run_rows["canary_runs"] = canary_runs(self.trials, self.changes)
        return self._run_rows["canary_runs"]

    def rows_of_run(self, table: str, run_id: str) -> pd.DataFrame:
        """The rows of ``table`` ("trials", "changes" or "baseline") of run ``run_id`` (grouped once
        per table: a summary of every run would otherwise scan every table once per run)."""
        frame = getattr(self, table)
        if table not in self._run_rows:
            self._run_rows[table] = frame.groupby("run_id", sort=False).indices
        return frame.iloc[self._run_rows[table].get(run_id, [])]


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
    canaries = canary_run_values(trials, settings.detection)
    return Trends(
        runs,
        trials,
        points,
        changes,
        history,
        against,
        system_fingerprints(fingerprints),
        settings,
        canaries,
        machine_series(canaries),
    )
