"""Rule entry point: the campaign's cells beside the published numbers (mlcampaign.analysis.published)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd

from mlcampaign.analysis.frame import CELL_KEYS
from mlcampaign.analysis.plots import published_comparison_figure, save_figure
from mlcampaign.analysis.published import CONFIGURATION_DIMENSIONS, comparison_table, measured_cells
from mlcampaign.analysis.tables import table_outputs, write_tables
from mlcampaign.job.rule_log import rule_log

snakemake = globals()["snakemake"]
with rule_log(snakemake.log[0]):
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
    write_tables({"published_comparison": table}, table_outputs(snakemake.output, ["published_comparison"]))
    save_figure(published_comparison_figure(table), snakemake.output.figure)
    print(f"{len(table)} rows; verdicts: {table['verdict'].value_counts().to_dict()}")
