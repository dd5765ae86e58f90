"""What a stored run came to, judged on its site's history up to it (and against the accepted baseline,
if given): the summary that ``mlcampaign summary`` prints, the workflow's ingest rule writes, and cron
reads (``run_summary``); the runs ``mlcampaign compare`` judges; and the regression check of a run not
stored yet, judged on the stored runs before it (``regression_check``)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from mlcampaign.analysis.baseline import current, load_store
from mlcampaign.analysis.frame import CELL_KEYS, NOT_RUN
from mlcampaign.analysis.regression import regression_table
from mlcampaign.history.merge import AnalysisSettings, HistoryError
from mlcampaign.history.run_alerts import run_alerts
from mlcampaign.history.store import ResultsStore, RunSummary, StoreError, open_store
from mlcampaign.history.trend_points import is_contended
from mlcampaign.history.trends import Trends, compute_trends
from mlcampaign.history.verdicts import CHANGE_VERDICTS, HISTORY_COLUMNS, LISTED_VERDICTS, judged_metrics, kind_of

SUMMARY_CHANGE_COLUMNS = [
    *CELL_KEYS,
    "metric",
    "direction",
    "kind",
    "verdict",
    "matters",
    "source",
    "change_start_run_id",
]
SUMMARY_CHANGE_COLUMNS += ["updates_run_id"]
SUMMARY_CHANGE_COLUMNS += ["previous_run_id", "relative_change", "ci_low", "ci_high", "interval_level", "p_value"]
SUMMARY_CHANGE_COLUMNS += ["adjusted_p", "false_alarm_rate", "n", "contended", "detail", "stack_changes"]
SUMMARY_CHANGE_COLUMNS += ["stack_changes_run_id"]
SUMMARY_CHANGE_COLUMNS += ["relative_to"]
SUMMARY_CELL_COLUMNS = [*CELL_KEYS, "metric", "kind", "verdict", "reason", "n", "ok_trials", "contended", "run_cv"]
SUMMARY_CELL_COLUMNS += ["smallest_detectable_first", "smallest_detectable", "trials_needed", "runs_needed", "detail"]
SUMMARY_CELL_COLUMNS += ["relative_to", "relative_detail"]
SUMMARY_HISTORY_COLUMNS = [c for c in HISTORY_COLUMNS if c != "alarmed"]
SUMMARY_BASELINE_COLUMNS = [*CELL_KEYS, "metric", "direction", "verdict", "value", "baseline_value"]
SUMMARY_BASELINE_COLUMNS += ["relative_change", "ci_low", "ci_high", "p_value", "n", "detail", "since_run_id"]


def baseline_rows(baseline_dir: str | Path | None) -> pd.DataFrame | None:
    """The current rows of the baseline store in ``baseline_dir`` (None without one)."""
    return current(load_store(Path(baseline_dir))) if baseline_dir else None


def _stored(store: ResultsStore, run_ids: Sequence[str]) -> tuple[list[dict], dict[str, list[dict]]]:
    """The manifests and the records (run id -> records) of the stored runs ``run_ids``."""
    return [store.manifest(run_id) for run_id in run_ids], store.records(run_ids)


def trends_of(store: ResultsStore, run_ids: Sequence[str], baseline: pd.DataFrame | None = None) -> Trends:
    """The trends of ``run_ids`` (runs of one campaign), judged with the settings of the latest of them,
    against the accepted ``baseline`` rows if given."""
    manifests, records = _stored(store, run_ids)
    latest = max(manifests, key=lambda manifest: (manifest["started_utc"], manifest["run_id"]))
    settings = AnalysisSettings.from_manifest(latest)
    return compute_trends(manifests, records, settings, baseline=baseline)


def _runs_at_site(store: ResultsStore, manifest: Mapping) -> list[RunSummary]:
    """The stored runs of ``manifest``'s campaign at its site, oldest first."""
    return store.list_runs(campaign=manifest["campaign"], site=manifest["site"])


def history_until(store: ResultsStore, run_id: str, since: str | None = None) -> list[str]:
    """The runs of ``run_id``'s campaign at its site up to it, oldest first (from ``since`` on, a run of
    the same campaign, if given): the history its verdicts are judged on."""
    manifest = store.manifest(run_id)
    at_site = [run.run_id for run in _runs_at_site(store, manifest)]
    first = 0
    if since is not None:
        if since not in at_site:
            raise HistoryError(
                f"run {since!r} is not a run of campaign {manifest['campaign']!r} at site {manifest['site']!r}; "
                f"runs there: {at_site}"
            )
        first = at_site.index(since)
    last = at_site.index(run_id)  # the runs are oldest first
    if first > last:
        raise HistoryError(f"run {since!r} started after run {run_id!r}: give the earlier run first")
    return at_site[first : last + 1]


def history_before(store: ResultsStore, manifest: Mapping) -> list[str]:
    """The stored runs of ``manifest``'s campaign at its site that started before it, oldest first (the
    run itself left out, stored or not): the history of a run judged before it is stored."""
    return [
        run.run_id
        for run in _runs_at_site(store, manifest)
        if run.run_id != manifest["run_id"] and run.started_utc < manifest["started_utc"]
    ]


def regression_check(
    manifest: Mapping,
    records: Iterable[Mapping],
    planned_trials: pd.DataFrame,
    baseline: pd.DataFrame,
    store_url: str,
) -> tuple[pd.DataFrame, Trends, str | None]:
    """The regression table (mlcampaign.analysis.regression) of a run from its own folder (``manifest``,
    its ``records`` and ``planned_trials``) against the accepted ``baseline`` rows, each cell judged with
    the run's settings and the run-to-run noise of its history: the site's earlier runs in the store at
    ``store_url`` (history_before), and this run's records. Also the trends, and why the store gave no
    history (None when it did: without one, every cell can only tell after more runs)."""
    manifests, by_run = [manifest], {manifest["run_id"]: list(records)}
    no_history = None
    try:
        with open_store(store_url, create=False) as store:
            earlier_manifests, earlier_records = _stored(store, history_before(store, manifest))
            manifests += earlier_manifests
            by_run |= earlier_records
    except StoreError as error:
        no_history = f"no history from the results store ({error}): every cell can only tell after more runs"
    trends = compute_trends(manifests, by_run, AnalysisSettings.from_manifest(manifest), baseline=baseline)
    metrics = [metric for metric in judged_metrics(trends.settings.metrics) if kind_of(metric) == "system"]
    table = regression_table(planned_trials, trends.rows_of_run("baseline", manifest["run_id"]), baseline, metrics)
    return table, trends, no_history


def run_summary_of(store: ResultsStore, run_id: str, baseline_dir: str | Path | None) -> dict:
    """The run's summary (run_summary), judged on its site's runs up to it."""
    trends = trends_of(store, history_until(store, run_id), baseline_rows(baseline_dir))
    return run_summary(trends, run_id) | {"store": store.url}


def run_summary(trends: Trends, run_id: str) -> dict:
    """What one run came to, as plain JSON-ready data for cron jobs and CI (docs/history.md). Keys:

    - ``run_id``, ``campaign``, ``site``, ``started_utc``: from the run's manifest;
    - ``settings``: the detection settings it was judged with (target change, false-alarm rate, window,
      confirmation, whether contended trials are kept);
    - ``trials``: ``planned`` (the run's own trials), ``ok``, ``failed``, ``not_run`` (no record),
      ``contended`` (ok trials whose timing was disturbed);
    - ``alert_groups``: what the run's listings come to, one group per cause (mlcampaign.history.alerts:
      system change, software-stack change, benchmark change, convergence change, outlying run, contention),
      each with ``cause``, ``matters``, ``systems``, ``cells``, ``relative_change``, ``ci_low``, ``ci_high``,
      ``start_run_id``, ``listed_at_run_id``, ``stack_changes`` and a one-line ``detail`` (docs/regression.md);
    - ``unjudged``: the cells and metrics with ok trials in this run but no value to judge (every trial
      contended and left out, none reached the target): never nothing to report;
    - ``changes``: the cells and metrics whose per-run verdict at this run lists a change — a regression
      or an improvement (an alarm that matters, ``kind`` system or convergence), a minor shift or an
      outlying run (``matters`` false; ``source`` per run or big drop; ``updates_run_id``: the run whose
      listing of the same change this one updates) — or is "not measured" (no ok trial, after a run
      that had some): the run in which the change started, its size with the interval and p-value at
      the stated false-alarm rate, and what changed in the stack since the run before it;
    - ``history_changes``: whole-history change points first found by this run's analysis, each named
      by the run in which it started (a change the per-run test had not listed: ``kind`` alarm or minor
      shift, ``matters``);
    - ``cannot_tell``: the cells and metrics whose history cannot decide yet, with the reason, the
      smallest change detectable with 90 % power, and the runs or trials per run the target change needs;
    - ``cells``: every judged cell and metric at this run with the same detectability figures;
    - ``baseline``: null without a baseline, else the cells and metrics whose verdict against it is in
      CHANGE_VERDICTS, with ``since_run_id`` (the first run of the series of runs with that verdict);
    - ``counts``: ``regressions``, ``improvements`` (system metrics; alarms that matter),
      ``convergence_regressions``, ``history_regressions`` and ``history_improvements`` (found later;
      those that matter), ``minor_shifts`` (per run and whole history), ``outlying_runs``, ``not_measured`` and
      ``cannot_tell`` (cells), ``contended_trials``, ``baseline_regressions`` and
      ``baseline_not_measured`` (null without a baseline), ``unjudged`` (cells), ``alert_groups`` and
      ``alert_groups_that_matter``.
    """
    manifest = next((run for run in trends.runs if run["run_id"] == run_id), None)
    if manifest is None:
        raise ValueError(f"run {run_id!r} is not among the trends' runs {[run['run_id'] for run in trends.runs]}")
    trials = _trial_counts(trends.rows_of_run("trials", run_id))
    rows = trends.rows_of_run("changes", run_id)
    # "Not measured" is a change only for a cell measured in an earlier run.
    first_measured = pd.MultiIndex.from_frame(rows[CELL_KEYS]).map(trends.first_measured().get)
    before = np.asarray(first_measured.fillna(np.inf), float) < rows["run_order"].to_numpy()
    not_measured = rows.loc[(rows["verdict"] == "not measured").to_numpy() & before]
    listed = pd.concat([rows.loc[rows["verdict"].isin(LISTED_VERDICTS)], not_measured.drop_duplicates(CELL_KEYS)])
    found = trends.history.loc[(trends.history["first_found_run_id"] == run_id) & ~trends.history["alarmed"]]
    cannot_tell = rows.loc[rows["verdict"] == "cannot tell yet"]
    groups, unjudged = run_alerts(trends, run_id, rows, found)
    summary = {
        "run_id": run_id,
        "campaign": manifest["campaign"],
        "site": manifest["site"],
        "started_utc": manifest["started_utc"],
        "settings": _settings(trends.settings),
        "trials": trials,
        "alert_groups": _plain(groups),
        "unjudged": _records(unjudged, list(unjudged.columns)),
        "changes": _records(listed, SUMMARY_CHANGE_COLUMNS),
        "history_changes": _records(found, SUMMARY_HISTORY_COLUMNS),
        "cannot_tell": _records(cannot_tell, SUMMARY_CELL_COLUMNS),
        "cells": _records(rows, SUMMARY_CELL_COLUMNS),
        "baseline": None,
        "counts": _counts(rows, found, not_measured, cannot_tell, trials["contended"]),
    }
    summary["counts"] |= {
        "unjudged": _cell_count(unjudged),
        "alert_groups": len(groups),
        "alert_groups_that_matter": sum(group["matters"] for group in groups),
    }
    if trends.baseline is not None:
        against = trends.rows_of_run("baseline", run_id)
        against = against.loc[against["verdict"].isin(CHANGE_VERDICTS)]
        summary["baseline"] = _records(against, SUMMARY_BASELINE_COLUMNS)
        summary["counts"]["baseline_regressions"] = int((against["verdict"] == "regression").sum())
        summary["counts"]["baseline_not_measured"] = _cell_count(against.loc[against["verdict"] == "not measured"])
    return summary


def _settings(settings: AnalysisSettings) -> dict:
    """The detection settings a run was judged with, as its summary states them."""
    detection_settings = settings.detection
    return {
        "target_change": detection_settings.target_change,
        "false_alarm_rate": detection_settings.false_alarm_rate,
        "window": detection_settings.window,
        "confirmation": detection_settings.confirmation,
        "keep_contended": settings.keep_contended,
    }


def _trial_counts(trials: pd.DataFrame) -> dict:
    """A run's planned trials by outcome, and its ok trials whose timing was disturbed."""
    status = trials["status"]
    return {
        "planned": len(status),
        "ok": int((status == "ok").sum()),
        "failed": int((status == "failed").sum()),
        "not_run": int((status == NOT_RUN).sum()),
        "contended": int(((status == "ok") & is_contended(trials)).sum()),
    }


def _counts(
    rows: pd.DataFrame, found: pd.DataFrame, not_measured: pd.DataFrame, cannot_tell: pd.DataFrame, contended: int
) -> dict:
    """The summary's counts (run_summary) from the run's ``rows`` and the whole-history changes ``found``
    by it; those against the baseline are filled in where there is one."""
    system = rows.loc[rows["kind"] == "system", "verdict"].value_counts()
    matters = found.loc[found["matters"].astype(bool), "verdict"].value_counts()
    return {
        "regressions": int(system.get("regression", 0)),
        "improvements": int(system.get("improvement", 0)),
        "convergence_regressions": int(((rows["kind"] == "convergence") & (rows["verdict"] == "regression")).sum()),
        "history_regressions": int(matters.get("regression", 0)),
        "history_improvements": int(matters.get("improvement", 0)),
        "minor_shifts": int((rows["verdict"] == "minor shift").sum() + (found["kind"] == "minor shift").sum()),
        "outlying_runs": int((rows["verdict"] == "outlying run").sum()),
        "not_measured": _cell_count(not_measured),
        "cannot_tell": _cell_count(cannot_tell),
        "contended_trials": contended,
        "baseline_regressions": None,
        "baseline_not_measured": None,
    }


def _plain(value):
    """Alert groups as JSON-ready data: NaN -> null, numpy numbers -> plain ones."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, np.generic):
        value = value.item()
    return None if isinstance(value, float) and math.isnan(value) else value


def _cell_count(rows: pd.DataFrame) -> int:
    return len(rows[CELL_KEYS].drop_duplicates())


def _records(frame: pd.DataFrame, columns: Sequence[str]) -> list[dict]:
    """Rows as JSON-ready dicts (NaN -> null, numpy numbers -> plain ones) through pandas' JSON writer."""
    return json.loads(frame[list(columns)].to_json(orient="records"))
