"""Rule entry point: each table as an HTML page for the Snakemake report."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd

from mlcampaign.analysis.outputs import TABLES
from mlcampaign.analysis.tables import html_view
from mlcampaign.job.rule_log import rule_log

snakemake = globals()["snakemake"]
with rule_log(snakemake.log[0]):
    for name, path in snakemake.output.items():
        Path(path).write_text(html_view(pd.read_parquet(snakemake.input[name]), name, TABLES[name]))
    print(f"{len(snakemake.output)} table views")
