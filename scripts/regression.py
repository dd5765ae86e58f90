"""Rule entry point: the run's cells against the baseline store (table and figure), judged with the run-to-run
noise of each cell's history: the site's earlier runs in the results store, and this run's records."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd

from mlcampaign.analysis.baseline import current, read_store
from mlcampaign.analysis.plots import regression_figure, save_figure
from mlcampaign.analysis.regression import regression_table
from mlcampaign.analysis.tables import table_outputs, write_tables
from mlcampaign.history.bundle import read_run_directory
from mlcampaign.history.merge import AnalysisSettings
from mlcampaign.history.store import StoreError, open_store
from mlcampaign.history.trends import compute_trends, judged_metrics, kind_of
from mlcampaign.job.rule_log import rule_log

snakemake = globals()["snakemake"]
with rule_log(snakemake.log[0]):
    run = read_run_directory(Path(snakemake.input.manifest).parent)
    run_id, started = run.manifest["run_id"], run.manifest["started_utc"]
    manifests, records = [run.manifest], {run_id: [record_file.record for record_file in run.records]}
    try:
        with open_store(snakemake.params.store, create=False) as store:
            earlier = [
                summary.run_id
                for summary in store.list_runs(campaign=run.manifest["campaign"], site=run.manifest["site"])
                if summary.run_id != run_id and summary.started_utc < started
            ]
            manifests += [store.manifest(earlier_id) for earlier_id in earlier]
            records |= store.records(earlier)
    except StoreError as error:
        print(f"no history from the results store ({error}): every cell can only tell after more runs")
    settings = AnalysisSettings.from_manifest(run.manifest)
    baseline = current(read_store(snakemake.input.baselines))
    trends = compute_trends(manifests, records, settings, baseline=baseline)
    metrics = [metric for metric in judged_metrics(settings.metrics) if kind_of(metric) == "system"]
    table = regression_table(
        pd.read_parquet(snakemake.input.planned_trials), trends.rows_of_run("baseline", run_id), baseline, metrics
    )
    write_tables({"regression": table}, table_outputs(snakemake.output, ["regression"]))
    save_figure(regression_figure(table, settings.detection.target_change), snakemake.output.figure)
    counts = table["verdict"].value_counts().to_dict()
    print(
        f"{len(baseline)} baseline rows from {len(snakemake.input.baselines)} file(s); {len(manifests) - 1} earlier "
        f"run(s) of the site; verdicts {counts}"
    )
