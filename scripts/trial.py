"""Rule entry point: one trial job (mlcampaign.job.supervisor): launch the trial's processes, end with its record."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlcampaign.job.supervisor import supervise

snakemake = globals()["snakemake"]
sys.exit(
    supervise(
        json.loads(snakemake.params.spec),
        Path(snakemake.input.dataset_id),
        Path(snakemake.output.record),
        Path(snakemake.output.mllog),
        Path(snakemake.log[0]),
        snakemake.resources.runtime,
    )
)
