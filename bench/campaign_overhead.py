"""Campaign overhead: a local campaign's wall time vs the sum of its trials' training time.

    .venv/bin/python bench/campaign_overhead.py [--trials 3]

Runs a small campaign (resnet50-synthetic on the bench's small split, 2 epochs a trial) with the real
CLI, ``snakemake --profile profiles/local`` in a fresh directory: staging, trials, trials table,
analysis tables, figures and report. A trial's training time is its record's
``metrics.time_to_train_s`` (MLPerf run_start to run_stop, evaluation included).

Snakemake's own log (start and finish of every job, 1 s resolution) splits the wall time into
wall = sum(training) + n x k + c:
- ``k``: each trial job's time beyond its training (process start, Python and library imports,
  dataset verification, model set-up, FLOP counting, the roofline measurement, record writing);
- ``c``: the campaign's fixed cost (Snakemake start and planning, staging, aggregation, figures,
  report, and the scheduling gaps between jobs).
Goal: wall <= 1.05 x sum(training) + a small constant, i.e. k <= 0.05 x a trial's training time:
met by trials that train at least k / 0.05 = 20 k seconds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from _common import CONTENTION_NOTE, REPO, SMALL_SPLITS

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
BENCHMARK = "resnet50-synthetic"
GOAL = 1.05


def campaign(trials: int) -> dict:
    return {
        "campaign": f"bench-overhead-{trials}",
        "seed": 1,
        "trials": trials,
        "systems": ["local-cpu"],
        "benchmarks": [BENCHMARK],
        "matrix": {"scales": ["1x1"], "precisions": ["fp32"]},
        "benchmark_overrides": {BENCHMARK: {"dataset": SMALL_SPLITS[BENCHMARK], "training": {"epochs_max": 2}}},
    }


def job_seconds(log: Path) -> dict[str, list[float]]:
    """Wall seconds of every finished job in a Snakemake log, by rule."""
    lines = log.read_text().splitlines()
    started, seconds = {}, {}
    stamp = None
    for index, line in enumerate(lines):
        if line.startswith("[") and line.endswith("]"):
            stamp = datetime.datetime.strptime(line.strip("[]"), "%a %b %d %H:%M:%S %Y")
        elif line.strip().startswith("jobid:") and stamp is not None and index >= 2:
            started[line.split(":")[1].strip()] = stamp
        elif finished := re.match(r"Finished jobid: (\S+) \(Rule: (\S+)\)", line):
            job, rule = finished.groups()
            seconds.setdefault(rule, []).append((stamp - started[job]).total_seconds())
    return seconds


def run_campaign(trials: int, workdir: Path) -> dict:
    config = campaign(trials)
    configfile = workdir / "campaign.yaml"
    configfile.write_text(yaml.safe_dump(config))
    command = [SNAKEMAKE, "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir)]
    command += ["--profile", str(REPO / "profiles" / "local"), "--configfile", str(configfile)]
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    records = [json.loads(path.read_text()) for path in (workdir / "results" / config["campaign"]).rglob("record.json")]
    if len(records) != trials or any(record["status"] != "ok" for record in records):
        raise SystemExit(f"expected {trials} ok records in {workdir}, found {[r['status'] for r in records]}")
    jobs: dict[str, list[float]] = {}
    # The report rule runs `snakemake --report`, which writes a log of its own (with no jobs).
    for log in (workdir / ".snakemake" / "log").glob("*.snakemake.log"):
        for rule, seconds in job_seconds(log).items():
            jobs.setdefault(rule, []).extend(seconds)
    return {
        "trials": trials,
        "wall": wall,
        "training": sum(record["metrics"]["time_to_train_s"] for record in records),
        "jobs": jobs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3, help="trials of the campaign")
    args = parser.parse_args()
    print(f"{CONTENTION_NOTE}; on a shared machine every part below is slowed alike, roughly")
    with tempfile.TemporaryDirectory(prefix="bench-campaign-") as tmp:
        run = run_campaign(args.trials, Path(tmp))
    n, wall, training, jobs = run["trials"], run["wall"], run["training"], run["jobs"]
    trial_jobs = sum(jobs["trial"])
    per_trial = (trial_jobs - training) / n
    fixed = wall - training - n * per_trial
    other = ", ".join(f"{rule} {sum(s):.0f} s" for rule, s in sorted(jobs.items()) if rule != "trial")
    print(f"{n} trials: wall {wall:.1f} s, sum of training {training:.1f} s ({training / n:.1f} s a trial)")
    print(f"  ratio wall / sum(training): {wall / training:.2f} (goal <= {GOAL} + a small constant)")
    print(f"  k = (trial jobs {trial_jobs:.0f} s - training) / {n} = {per_trial:.1f} s per trial beyond training")
    print(f"  c = wall - training - n k = {fixed:.1f} s per campaign; its jobs: {other}; Snakemake itself and the")
    print(f"    gaps between jobs: {fixed - sum(sum(s) for rule, s in jobs.items() if rule != 'trial'):.1f} s")
    print(
        f"  wall <= {GOAL} x sum(training) + c holds for trials training >= k / {GOAL - 1:.2f} = "
        f"{per_trial / (GOAL - 1):.0f} s each"
    )


if __name__ == "__main__":
    main()
