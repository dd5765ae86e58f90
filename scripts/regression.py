"""Rule entry point: the campaign's cells against the baseline store (table and figure)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd

from mlcampaign.analysis.baseline import current, read_store
from mlcampaign.analysis.plots import regression_figure, save_figure
from mlcampaign.analysis.regression import Thresholds, regression_table
from mlcampaign.analysis.tables import table_outputs, write_tables
from mlcampaign.job.rule_log import rule_log

snakemake = globals()["snakemake"]
with rule_log(snakemake.log[0]):
    settings = snakemake.params.regression
    baseline = current(read_store(snakemake.input.baselines))
    table = regression_table(
        pd.read_parquet(snakemake.input.planned_trials),
        baseline,
        settings["metrics"],
        Thresholds.from_config(settings),
        snakemake.params.seed,
    )
    write_tables({"regression": table}, table_outputs(snakemake.output, ["regression"]))
    save_figure(regression_figure(table, settings["min_relative_change"]), snakemake.output.figure)
    counts = table["verdict"].value_counts().to_dict()
    print(f"{len(baseline)} baseline rows from {len(snakemake.input.baselines)} file(s); verdicts {counts}")
