"""Rule entry point: the campaign's cells against the baseline store (table and figure)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd

from mlcampaign.analysis.regression import Thresholds, regression_table
from mlcampaign.baseline import current, read_store
from mlcampaign.plots import DPI, regression_figure

snakemake = globals()["snakemake"]
with open(snakemake.log[0], "w") as log:
    sys.stderr = log  # tracebacks into the log too
    settings = snakemake.params.regression
    baseline = current(read_store(snakemake.input.baselines))
    table = regression_table(
        pd.read_parquet(snakemake.input.planned_trials),
        baseline,
        settings["metrics"],
        Thresholds.from_config(settings),
        snakemake.params.seed,
    )
    table.to_csv(snakemake.output.table_csv, index=False)
    table.to_parquet(snakemake.output.table_parquet, index=False)
    figure = regression_figure(table, settings["min_relative_change"])
    figure.savefig(snakemake.output.figure, dpi=DPI)
    counts = table["verdict"].value_counts().to_dict()
    print(f"{len(baseline)} baseline rows from {len(snakemake.input.baselines)} file(s); verdicts {counts}", file=log)
