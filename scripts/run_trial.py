"""Trial entry point, started by the system's launcher (python, torchrun, srun, mpirun) on compute nodes.

Puts the workflow checkout on sys.path so that compute nodes need no install of the package.
Exits 1 when the trial failed, so that the launcher stops the other ranks; with
``--launch-failed STATUS`` (the rule's fallback after a failed launch) it keeps rank 0's record
or writes a failure record if there is none.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlcampaign.data.manifest import staged_paths
from mlcampaign.scheduler import Deadline
from mlcampaign.train import record_launch_failure, run_trial


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", required=True, help="trial spec as JSON text")
    parser.add_argument(
        "--dataset-id", required=True, type=Path, help="the staged dataset's id file (its data and manifest beside it)"
    )
    parser.add_argument("--record", required=True, type=Path)
    parser.add_argument("--mllog", required=True, type=Path)
    parser.add_argument("--launch-failed", type=int, metavar="STATUS", help="exit status of the failed launch")
    parser.add_argument(
        "--time-limit-min", type=float, help="the job's time limit: training stops with reason timeout before it"
    )
    args = parser.parse_args()
    spec = json.loads(args.spec)
    dataset_dir, manifest = staged_paths(args.dataset_id)
    if args.launch_failed is not None:
        record = record_launch_failure(spec, manifest, args.record, args.mllog, args.launch_failed)
        print(f"launch exited with status {args.launch_failed}; record: {record['status']}")
        return
    deadline = Deadline.from_limit(args.time_limit_min)
    record = run_trial(spec, dataset_dir, manifest, args.record, args.mllog, deadline)
    metrics = record["metrics"]
    print(
        f"trial {record['status']}: {record['benchmark']['target_metric']}={metrics['achieved_quality']} "
        f"after {metrics['epochs_run']} epochs, {metrics['throughput_samples_per_s']} samples/s"
    )
    sys.exit(0 if record["status"] == "ok" else 1)


if __name__ == "__main__":
    main()
