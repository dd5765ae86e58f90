"""Rule entry point: fail (exit status 1) when the regression table has a regressed cell."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd

from mlcampaign.analysis.regression import gate_failures, gate_message
from mlcampaign.job.rule_log import rule_log

snakemake = globals()["snakemake"]
table = pd.read_parquet(snakemake.input.table)
failed = not gate_failures(table).empty
if failed:
    message = (
        f"regression check failed: {gate_message(table)}\n"
        f"table: {snakemake.input.table}\nfigure: {snakemake.input.figure}"
    )
else:
    message = f"regression check passed: verdicts {table['verdict'].value_counts().to_dict()}"
with rule_log(snakemake.log[0]):
    print(message)
# A failure goes to the console too (CI logs); the non-zero exit fails the job and `snakemake`.
sys.exit(message if failed else 0)
