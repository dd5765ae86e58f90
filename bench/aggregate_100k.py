"""Time the aggregation of 100 000 synthetic trial records into every table (target: <= 5 s).

    .venv/bin/python bench/aggregate_100k.py

The records (tests/synthetic_records.py) are generated in memory before the clock starts; one
in every 1000 is checked against the record schema. The timed part is what the aggregate rule
does after reading the records: build_tables (projection, join with the plan, bootstrap, every
table). Writing the tables as CSV and Parquet is timed separately.
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))  # tests/synthetic_records.py

import synthetic_records as synthetic

from mlcampaign.analysis.outputs import TABLE_FORMATS, TABLES
from mlcampaign.analysis.tables import build_tables, write_tables
from mlcampaign.records.files import validate_record

SCALES = ["1x1", "1x2", "1x4", "2x4", "4x4", "8x4", "16x4", "32x4", "64x4", "128x4"]
PRECISIONS = ["fp32", "bf16"]
FAILURE_REASONS = ["out_of_memory", "compile_error", "unsupported", "diverged", "timeout"]


def synthetic_campaign(systems: int, benchmarks: int, trials: int, replicates: int, seed: int):
    rng = np.random.default_rng(seed)
    plan, records = [], []
    for s in range(systems):
        for b in range(benchmarks):
            for scale in SCALES:
                for precision in PRECISIONS:
                    for trial in range(trials):
                        for replicate in range(replicates):
                            row = synthetic.plan_row(f"system{s:02d}", f"bench{b}", scale, precision, trial, replicate)
                            plan.append(row)
                            failure = FAILURE_REASONS[int(rng.integers(5))] if rng.random() < 0.02 else None
                            records.append(
                                synthetic.record(
                                    row,
                                    rng,
                                    base_throughput=100.0 + 20 * s,
                                    efficiency=0.8,
                                    batch_scaling="weak" if b % 2 else "strong",
                                    failure_reason=failure,
                                )
                            )
    benchmark_configs = {f"bench{b}": synthetic.benchmark_config(exponent=10) for b in range(benchmarks)}
    return pd.DataFrame(plan), records, benchmark_configs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples (campaign default)")
    args = parser.parse_args()
    # 20 systems x 10 benchmarks (half strong, half weak scaling) x 10 scales x 2 precisions = 4000
    # cells, 5 seeds x 5 replicates each.
    plan, records, benchmarks = synthetic_campaign(systems=20, benchmarks=10, trials=5, replicates=5, seed=0)
    for record in records[::1000]:
        validate_record(record)
    cells = len(plan.drop_duplicates(["system", "benchmark", "cell"]))
    print(f"{len(records)} records, {cells} cells, {args.resamples} bootstrap resamples")

    start, start_cpu = time.perf_counter(), time.process_time()
    tables = build_tables(records, plan, benchmarks, confidence=0.95, bootstrap_resamples=args.resamples, seed=1)
    build_s, build_cpu_s = time.perf_counter() - start, time.process_time() - start_cpu
    with tempfile.TemporaryDirectory() as directory:
        paths = {name: {fmt: Path(directory) / f"{name}.{fmt}" for fmt in TABLE_FORMATS} for name in TABLES}
        start = time.perf_counter()
        write_tables(tables, paths)
        write_s = time.perf_counter() - start
    rows = ", ".join(f"{name} {len(table)}" for name, table in tables.items())
    print(f"table rows: {rows}")
    # CPU time as well: on a shared machine the wall time also counts other people's work.
    print(f"build all tables: {build_s:.2f} s wall, {build_cpu_s:.2f} s CPU (limit 5 s)")
    print(f"write them as CSV and Parquet: {write_s:.2f} s")


if __name__ == "__main__":
    main()
