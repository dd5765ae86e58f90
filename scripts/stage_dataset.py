"""Rule entry point: stage one dataset (generator or path) into its directory; write its manifest and id file."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlcampaign.data.staging import stage_into
from mlcampaign.job.rule_log import rule_log

snakemake = globals()["snakemake"]
with rule_log(snakemake.log[0]):
    dataset = json.loads(snakemake.params.stage)["dataset"]
    manifest = stage_into(dataset, Path(snakemake.output.dataset_id).parent)
    seconds = manifest["staging"]["seconds"]
    print(f"staged {len(manifest['files'])} files, dataset id {manifest['dataset_id']}, {seconds:.1f} s")
