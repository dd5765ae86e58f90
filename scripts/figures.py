"""Rule entry point: every figure of the campaign from its tables."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd

from mlcampaign.analysis.plots import write_figures
from mlcampaign.job.rule_log import rule_log

snakemake = globals()["snakemake"]
with rule_log(snakemake.log[0]):
    tables = {name: pd.read_parquet(path) for name, path in snakemake.input.items()}
    write_figures(tables, dict(snakemake.output.items()))
    print(f"{len(snakemake.output)} figures from {len(tables)} tables")
