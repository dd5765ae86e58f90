"""Rule entry point: the campaign's cells beside the published numbers (mlcampaign.analysis.published)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd

from mlcampaign.analysis.frame import CELL_KEYS
from mlcampaign.analysis.published import CONFIGURATION_DIMENSIONS, comparison_table, measured_cells
from mlcampaign.plots import DPI, published_comparison_figure

snakemake = globals()["snakemake"]
with open(snakemake.log[0], "w") as log:
    sys.stderr = log  # tracebacks into the log too
    planned_trials = pd.read_parquet(snakemake.input.planned_trials)
    scaling = [pd.read_parquet(snakemake.input.scaling_strong), pd.read_parquet(snakemake.input.scaling_weak)]
    measured = measured_cells(planned_trials, scaling, snakemake.params.confidence)
    cells = planned_trials[[*CELL_KEYS, *CONFIGURATION_DIMENSIONS]].drop_duplicates(subset=CELL_KEYS)
    table = comparison_table(
        measured,
        cells,
        pd.read_parquet(snakemake.input.capability),
        snakemake.params.published,
        snakemake.params.stand_ins,
    )
    table.to_csv(snakemake.output.csv, index=False)
    table.to_parquet(snakemake.output.parquet, index=False)
    published_comparison_figure(table).savefig(snakemake.output.figure, dpi=DPI)
    print(f"{len(table)} rows; verdicts: {table['verdict'].value_counts().to_dict()}", file=log)
