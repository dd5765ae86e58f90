"""Time the ingest of 100 000 synthetic trial records into the embedded results store (goal: <= 30 s).

    .venv/bin/python bench/store_ingest.py [--url STORE_URL]

52 runs (4 sites x 13 weekly runs, 1 923 or 1 924 records each, 2% failure records) are made by
tests/synthetic_records.py before the clock starts, then ingested one run per call into a new
store: a temporary SQLite file, or the empty store --url names (e.g. a PostgreSQL database). The
timed part is what the workflow's ingest rule does for a run: canonical JSON and sha256 of every
record, the record-schema check, and the run's transaction. Timed separately: ingesting every run
again (nothing new: nothing is written) and reading every record back.
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))  # tests/synthetic_records.py

import synthetic_records as synthetic

from mlcampaign.history.store import RecordFile, open_store
from mlcampaign.records.files import canonical_json

RECORDS = 100_000
SITES = ["archer2", "cirrus", "eidf", "local"]
WEEKS = 13
GOAL_S = 30.0
BENCHMARKS = ["resnet50", "cosmoflow", "deepcam", "extreme-weather"]
SCALES = ["1x1", "1x2", "1x4", "2x4", "4x4", "8x4", "16x4", "32x4", "64x4", "128x4"]
FAILURE_REASONS = ["out_of_memory", "timeout", "diverged", "scheduler", "unsupported"]


def synthetic_runs(seed: int) -> list[tuple[dict, list[RecordFile]]]:
    """(manifest, records) of every run; records of a run are distinct trials of its site's system."""
    rng = np.random.default_rng(seed)
    runs = []
    sizes = np.array_split(np.arange(RECORDS), len(SITES) * WEEKS)
    for number, indices in enumerate(sizes):
        site, week = SITES[number % len(SITES)], number // len(SITES)
        run_id = f"{site}-2026w{week + 1:02d}"
        manifest = {
            "run_id": run_id,
            "campaign": "synthetic",
            "site": site,
            "started_utc": f"2026-{1 + week // 4:02d}-{1 + 7 * (week % 4):02d}T08:00:00+00:00",
            "campaign_config": {"campaign": "synthetic"},
            "systems": {f"{site}-system": {}},
            "benchmarks": {name: synthetic.benchmark_config() for name in BENCHMARKS},
            "plan": [],
            "unplanned": [],
            "workflow_commit": None,
        }
        records = []
        for i in range(len(indices)):
            row = synthetic.plan_row(f"{site}-system", BENCHMARKS[i % 4], SCALES[(i // 4) % 10], "fp32", trial=i // 40)
            failure = FAILURE_REASONS[int(rng.integers(5))] if rng.random() < 0.02 else None
            record = synthetic.record(row, rng, failure_reason=failure)
            records.append(RecordFile(f"results/synthetic/runs/{run_id}/{i}/record.json", record))
        runs.append((manifest, records))
    return runs


def timed(action) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    action()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="an empty store to ingest into (default: a new SQLite file in a temp directory)")
    args = parser.parse_args()
    runs = synthetic_runs(seed=0)
    sizes = sorted({len(records) for _, records in runs})
    mean_bytes = np.mean([len(canonical_json(file.record)) for file in runs[0][1]])
    print(f"{RECORDS} records in {len(runs)} runs ({sizes[0]}-{sizes[-1]} each), {mean_bytes / 1000:.1f} kB JSON each")

    with tempfile.TemporaryDirectory() as directory:
        url = args.url or f"sqlite:///{directory}/history.db"
        with open_store(url) as store:
            if store.list_runs():
                sys.exit(f"{url} already holds runs: give an empty store")
            added = []
            ingest_s, ingest_cpu_s = timed(lambda: added.extend(store.ingest(*run).records_added for run in runs))
            assert sum(added) == RECORDS, f"{sum(added)} records added, not {RECORDS}"
            again_s, _ = timed(lambda: [store.ingest(*run) for run in runs])
            read = []
            read_s, _ = timed(lambda: read.extend(store.records([m["run_id"] for m, _ in runs]).values()))
            assert sum(map(len, read)) == RECORDS
        store_bytes = Path(directory, "history.db").stat().st_size if args.url is None else None

    # CPU time as well: on a shared machine the wall time also counts other people's work.
    print(f"store: {url if args.url else 'SQLite file in a temporary directory'}")
    print(
        f"ingest: {ingest_s:.2f} s wall, {ingest_cpu_s:.2f} s CPU, {RECORDS / ingest_s:.0f} records/s "
        f"(goal {GOAL_S:.0f} s: ratio {ingest_s / GOAL_S:.2f})"
    )
    print(f"ingest every run again (nothing new): {again_s:.2f} s")
    print(f"read every record back: {read_s:.2f} s")
    if store_bytes is not None:
        print(f"store file: {store_bytes / 1e6:.0f} MB")


if __name__ == "__main__":
    main()
