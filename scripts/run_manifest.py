"""Rule entry point: the run's manifest (run.json) and results/<campaign>/latest (mlcampaign.plan.runs)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlcampaign.job.rule_log import rule_log
from mlcampaign.records.run_manifest import write_manifest

snakemake = globals()["snakemake"]
with rule_log(snakemake.log[0]):
    write_manifest(Path(snakemake.output.manifest).parent, snakemake.params.manifest)
    print(f"run {snakemake.params.manifest['run_id']}: {snakemake.output.manifest}")
