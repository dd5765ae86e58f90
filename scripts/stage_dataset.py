"""Rule entry point: stage one dataset (generator or path) into its directory and write its manifest."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlcampaign.data.staging import stage

snakemake = globals()["snakemake"]
with open(snakemake.log[0], "w") as log:
    sys.stdout = sys.stderr = log
    manifest = stage(json.loads(snakemake.params.dataset), Path(snakemake.output.data), Path(snakemake.output.manifest))
    seconds = manifest["staging"]["seconds"]
    print(f"staged {len(manifest['files'])} files, dataset id {manifest['dataset_id']}, {seconds:.1f} s")
