"""Rule entry point: flatten every trial record of the campaign into one CSV row each."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlcampaign.analysis.frame import flatten
from mlcampaign.job.rule_log import rule_log
from mlcampaign.records.files import read_record

snakemake = globals()["snakemake"]
with rule_log(snakemake.log[0]):
    table = flatten([read_record(path) for path in snakemake.input.records])
    table.to_csv(snakemake.output.table, index=False)
    print(f"{len(table)} trials, {int((table['status'] == 'ok').sum())} ok")
