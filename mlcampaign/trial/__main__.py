"""Trial entry point, ``python -m mlcampaign.trial``, started by the system's launcher (python, torchrun, srun,
mpirun) on compute nodes, one process per rank (the trial job's supervisor, mlcampaign.job.supervisor, builds
the command, with the workflow's checkout on PYTHONPATH where the package is not installed).

Exits 1 when the trial failed, so that the launcher stops the other ranks.

Once the record is written and the trial closed (its MLPerf log, process group, Horovod), the process
ends at once (``os._exit``) after flushing its streams and logging handlers: Python's own finalisation
of a process that loaded torch and torchvision (module teardown, unloading their libraries) takes
0.5-1 s on 2 cores (bench/campaign_overhead.py), which every trial would pay and nothing needs.
"""

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from mlcampaign.job.deadlines import Deadline
from mlcampaign.trial.protocol import run_trial


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec-file", required=True, type=Path, help="the trial spec (JSON)")
    parser.add_argument(
        "--dataset-id", required=True, type=Path, help="the staged dataset's id file (its data and manifest beside it)"
    )
    parser.add_argument("--record", required=True, type=Path)
    parser.add_argument("--mllog", required=True, type=Path)
    parser.add_argument(
        "--deadline", type=float, help="when training stops with reason timeout (seconds since the epoch)"
    )
    args = parser.parse_args()
    spec = json.loads(args.spec_file.read_text())
    record = run_trial(spec, args.dataset_id, args.record, args.mllog, Deadline(args.deadline))
    metrics = record["metrics"]
    print(
        f"trial {record['status']}: {record['benchmark']['target_metric']}={metrics['achieved_quality']} "
        f"after {metrics['epochs_run']} epochs, {metrics['throughput_samples_per_s']} samples/s"
    )
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(0 if record["status"] == "ok" else 1)


if __name__ == "__main__":
    main()
