"""Trial entry point, started by the system's launcher (python, torchrun, srun, mpirun) on compute nodes.

Puts the workflow checkout on sys.path so that compute nodes need no install of the package.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlcampaign.train import run_trial


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", required=True, help="trial spec as JSON text")
    parser.add_argument("--dataset-dir", required=True, type=Path)
    parser.add_argument("--manifest", required=True, type=Path)
    parser.add_argument("--record", required=True, type=Path)
    parser.add_argument("--mllog", required=True, type=Path)
    args = parser.parse_args()
    record = run_trial(json.loads(args.spec), args.dataset_dir, args.manifest, args.record, args.mllog)
    metrics = record["metrics"]
    print(
        f"trial {record['status']}: {record['benchmark']['target_metric']}={metrics['achieved_quality']} "
        f"after {metrics['epochs_run']} epochs, {metrics['throughput_samples_per_s']} samples/s"
    )


if __name__ == "__main__":
    main()
