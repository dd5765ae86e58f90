"""Rule entry point: every figure of the campaign from its tables."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd

from mlcampaign.plots import write_figures

snakemake = globals()["snakemake"]
with open(snakemake.log[0], "w") as log:
    sys.stderr = log  # tracebacks into the log too
    tables = {name: pd.read_parquet(path) for name, path in snakemake.input.items()}
    write_figures(tables, dict(snakemake.output.items()))
    print(f"{len(snakemake.output)} figures from {len(tables)} tables", file=log)
