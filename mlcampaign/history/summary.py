"""What a stored run came to, judged on its site's history up to it (and against the accepted baseline,
if given): the summary that ``mlcampaign summary`` prints, the workflow's ingest rule writes, and cron
reads; and the runs ``mlcampaign compare`` and the regression check judge."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from mlcampaign.analysis.baseline import current, load_store
from mlcampaign.history.merge import AnalysisSettings, HistoryError
from mlcampaign.history.store import ResultsStore
from mlcampaign.history.trends import Trends, compute_trends, run_summary


def baseline_rows(baseline_dir: str | Path | None) -> pd.DataFrame | None:
    """The current rows of the baseline store in ``baseline_dir`` (None without one)."""
    return current(load_store(Path(baseline_dir))) if baseline_dir else None


def trends_of(store: ResultsStore, run_ids: Sequence[str], baseline: pd.DataFrame | None = None) -> Trends:
    """The trends of ``run_ids`` (runs of one campaign), judged with the settings of the latest of them,
    against the accepted ``baseline`` rows if given."""
    manifests = [store.manifest(run_id) for run_id in run_ids]
    latest = max(manifests, key=lambda manifest: (manifest["started_utc"], manifest["run_id"]))
    settings = AnalysisSettings.from_manifest(latest)
    return compute_trends(manifests, store.records(run_ids), settings, baseline=baseline)


def history_until(store: ResultsStore, run_id: str, since: str | None = None) -> list[str]:
    """The runs of ``run_id``'s campaign at its site up to it, oldest first (from ``since`` on, a run of
    the same campaign, if given): the history its verdicts are judged on."""
    manifest = store.manifest(run_id)
    at_site = [run.run_id for run in store.list_runs(campaign=manifest["campaign"], site=manifest["site"])]
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


def run_summary_of(store: ResultsStore, run_id: str, baseline_dir: str | Path | None) -> dict:
    """The run's summary (mlcampaign.history.trends.run_summary), judged on its site's runs up to it."""
    trends = trends_of(store, history_until(store, run_id), baseline_rows(baseline_dir))
    return run_summary(trends, run_id) | {"store": store.url}
