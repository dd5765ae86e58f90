"""DAG planning cost: `snakemake -n` on a generated 10 000-trial campaign vs a trivial Snakefile of the same shape.

The trivial workflow has the same jobs and edges (datasets -> trials -> one aggregation) but no config
validation, no trial matrix and no parameters, so the ratio is the planning overhead this project adds.
Goal: ratio <= 1.5.

    .venv/bin/python bench/dag_planning.py [--trials-per-benchmark 5000]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))

TRIVIAL_SNAKEFILE = """
BENCHMARKS = {benchmarks!r}
TRIALS = range({trials})


rule all:
    input:
        "results/trials.csv",


rule dataset:
    output:
        "results/datasets/{{benchmark}}/manifest.json",
    shell:
        "touch {{output}}"


rule trial:
    input:
        "results/datasets/{{benchmark}}/manifest.json",
    output:
        "results/trials/{{benchmark}}/trial{{trial}}/record.json",
    shell:
        "touch {{output}}"


rule table:
    input:
        expand("results/trials/{{benchmark}}/trial{{trial}}/record.json", benchmark=BENCHMARKS, trial=TRIALS),
    output:
        "results/trials.csv",
    shell:
        "touch {{output}}"
"""


def timed(command: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials-per-benchmark", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each; the minimum is reported")
    args = parser.parse_args()
    benchmarks = ["resnet50-digits", "resnet50-synthetic"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        campaign = {
            "campaign": "dag-planning",
            "seed": 1,
            "trials": args.trials_per_benchmark,
            "systems": ["local-cpu"],
            "benchmarks": benchmarks,
            "matrix": {"scales": ["1x1"], "precisions": ["fp32"]},
        }
        (tmp / "campaign.yaml").write_text(yaml.safe_dump(campaign))
        (tmp / "project").mkdir()
        (tmp / "trivial").mkdir()
        (tmp / "trivial" / "Snakefile").write_text(
            TRIVIAL_SNAKEFILE.format(benchmarks=benchmarks, trials=args.trials_per_benchmark)
        )
        project_cmd = [
            SNAKEMAKE,
            "-n",
            "--quiet",
            "--snakefile",
            str(REPO / "Snakefile"),
            "--profile",
            str(REPO / "profiles" / "local"),
            "--configfile",
            str(tmp / "campaign.yaml"),
        ]
        trivial_cmd = [SNAKEMAKE, "-n", "--quiet", "--cores", "1"]
        project = min(timed(project_cmd, tmp / "project") for _ in range(args.repeats))
        trivial = min(timed(trivial_cmd, tmp / "trivial") for _ in range(args.repeats))
    jobs = len(benchmarks) * args.trials_per_benchmark
    print(f"trials planned: {jobs}")
    print(f"project workflow  snakemake -n: {project:7.2f} s")
    print(f"trivial workflow  snakemake -n: {trivial:7.2f} s")
    print(f"ratio project / trivial: {project / trivial:.2f} (goal <= 1.5)")


if __name__ == "__main__":
    main()
