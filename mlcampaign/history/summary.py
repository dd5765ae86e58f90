"""What a stored run came to, against the run before it at its site (and the accepted baseline, if given):
the summary that ``mlcampaign summary`` prints, the workflow's ingest rule writes, and cron reads."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from mlcampaign.analysis.baseline import current, load_store
from mlcampaign.history.merge import AnalysisSettings
from mlcampaign.history.store import ResultsStore
from mlcampaign.history.trends import Trends, compute_trends, run_summary


def trends_of(store: ResultsStore, run_ids: Sequence[str], baseline_dir: str | Path | None) -> Trends:
    """The trends of ``run_ids`` (the runs of one campaign), against the accepted baseline if one is given."""
    manifests = [store.manifest(run_id) for run_id in run_ids]
    baseline = current(load_store(Path(baseline_dir))) if baseline_dir else None
    settings = AnalysisSettings.from_manifest(manifests[-1])
    return compute_trends(manifests, store.records(run_ids), settings, baseline=baseline)


def run_summary_of(store: ResultsStore, run_id: str, baseline_dir: str | Path | None) -> dict:
    """The run's summary (mlcampaign.history.trends.run_summary) against the run before it at its site."""
    manifest = store.manifest(run_id)
    at_site = [run.run_id for run in store.list_runs(campaign=manifest["campaign"], site=manifest["site"])]
    position = at_site.index(run_id)  # the runs are oldest first
    runs = at_site[max(0, position - 1) : position + 1]
    return run_summary(trends_of(store, runs, baseline_dir), run_id) | {"store": store.url}
