"""Rule entry point: the run's cells against the baseline store, judged on the site's history (table and figure)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd

from mlcampaign.analysis.baseline import current, read_store
from mlcampaign.analysis.plots import regression_figure, save_figure
from mlcampaign.analysis.tables import table_outputs, write_tables
from mlcampaign.history.bundle import read_run_directory
from mlcampaign.history.summary import regression_check
from mlcampaign.job.rule_log import rule_log

snakemake = globals()["snakemake"]
with rule_log(snakemake.log[0]):
    run = read_run_directory(Path(snakemake.input.manifest).parent)
    baseline = current(read_store(snakemake.input.baselines))
    records, planned = [file.record for file in run.records], pd.read_parquet(snakemake.input.planned_trials)
    table, trends, no_history = regression_check(run.manifest, records, planned, baseline, snakemake.params.store)
    if no_history:
        print(no_history)
    write_tables({"regression": table}, table_outputs(snakemake.output, ["regression"]))
    save_figure(regression_figure(table, trends.settings.detection.target_change), snakemake.output.figure)
    print(
        f"{len(baseline)} baseline rows from {len(snakemake.input.baselines)} file(s); {len(trends.runs) - 1} earlier "
        f"run(s) of the site; verdicts {table['verdict'].value_counts().to_dict()}"
    )
