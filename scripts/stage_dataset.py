"""Rule entry point: stage one dataset (generator or path) into its directory; write its manifest and id file."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlcampaign.data.manifest import write_dataset_id
from mlcampaign.data.staging import stage

snakemake = globals()["snakemake"]
with open(snakemake.log[0], "w") as log:
    sys.stdout = sys.stderr = log
    dataset = json.loads(snakemake.params.stage)["dataset"]
    manifest = stage(dataset, Path(snakemake.output.data), Path(snakemake.output.manifest))
    write_dataset_id(manifest, Path(snakemake.output.dataset_id))
    seconds = manifest["staging"]["seconds"]
    print(f"staged {len(manifest['files'])} files, dataset id {manifest['dataset_id']}, {seconds:.1f} s")
