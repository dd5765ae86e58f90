"""DAG planning cost: `snakemake -n` on a generated 10 000-trial campaign vs a trivial Snakefile of the same shape.

The trivial workflow has the same rules, jobs, files and edges (TRIVIAL_SNAKEFILE) but no config
validation, no trial matrix, no parameters or resources, so the ratio is the planning overhead this
project adds. Goal: ratio <= 1.5. Both are timed alternately (wall time, the minimum of the
repeats) and their CPU time is reported too, which load from other processes inflates less.

    .venv/bin/python bench/dag_planning.py [--trials-per-benchmark 5000]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlcampaign.analysis.outputs import FIGURE_TABLES, TABLES

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))

# The project's DAG without the project: the same rules, jobs, files and edges (datasets -> trials
# -> trials table, aggregation and ingest -> table views and figures -> report; run manifest -> ingest
# -> dashboard), every job a `touch`,
# nothing computed at planning but the file names.
TRIVIAL_SNAKEFILE = """
BENCHMARKS = {benchmarks!r}
TRIALS = range({trials})
TABLES = {tables!r}
FIGURES = {figures!r}
RECORDS = expand("results/trials/{{benchmark}}/trial{{trial}}/record.json", benchmark=BENCHMARKS, trial=TRIALS)


rule all:
    input:
        "results/trials.csv",
        "results/analysis/report.html",
        "results/dashboard/index.html",


rule stage_dataset:
    output:
        data=directory("results/datasets/{{benchmark}}/data"),
        manifest="results/datasets/{{benchmark}}/manifest.json",
        dataset_id="results/datasets/{{benchmark}}/dataset_id",
    log:
        "results/datasets/{{benchmark}}/stage.log",
    shell:
        "mkdir {{output.data}} && touch {{output.manifest}} {{output.dataset_id}} {{log}}"


rule trial:
    input:
        "results/datasets/{{benchmark}}/dataset_id",
    output:
        record="results/trials/{{benchmark}}/trial{{trial}}/record.json",
        mllog="results/trials/{{benchmark}}/trial{{trial}}/mllog.txt",
    log:
        "results/logs/{{benchmark}}/trial{{trial}}.log",
    shell:
        "touch {{output}} {{log}}"


rule trials_table:
    input:
        RECORDS,
    output:
        "results/trials.csv",
    shell:
        "touch {{output}}"


rule aggregate:
    input:
        RECORDS,
    output:
        expand("results/{{{{scope}}}}/tables/{{name}}.{{fmt}}", name=TABLES, fmt=("csv", "parquet")),
    shell:
        "touch {{output}}"


rule table_views:
    input:
        expand("results/{{{{scope}}}}/tables/{{name}}.parquet", name=TABLES),
    output:
        expand("results/{{{{scope}}}}/views/{{name}}.html", name=TABLES),
    shell:
        "touch {{output}}"


rule figures:
    input:
        expand("results/{{{{scope}}}}/tables/{{name}}.parquet", name=TABLES),
    output:
        expand("results/{{{{scope}}}}/figures/{{name}}.png", name=FIGURES),
    shell:
        "touch {{output}}"


rule report:
    input:
        rules.table_views.output,
        rules.figures.output,
    output:
        "results/{{scope}}/report.html",
    shell:
        "touch {{output}}"


rule run_manifest:
    output:
        "results/run.json",
    shell:
        "touch {{output}}"


rule ingest:
    input:
        "results/run.json",
        RECORDS,
    output:
        "results/ingested.json",
    shell:
        "touch {{output}}"


rule dashboard:
    input:
        "results/ingested.json",
    output:
        "results/dashboard/index.html",
    shell:
        "touch {{output}}"
"""


def timed(command: list[str], cwd: Path) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one run of ``command``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


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
            TRIVIAL_SNAKEFILE.format(
                benchmarks=benchmarks,
                trials=args.trials_per_benchmark,
                tables=list(TABLES),
                figures=list(FIGURE_TABLES),
            )
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
        runs = {"project": [], "trivial": []}
        for _ in range(args.repeats):  # alternately, so that load from elsewhere hits both alike
            runs["project"].append(timed(project_cmd, tmp / "project"))
            runs["trivial"].append(timed(trivial_cmd, tmp / "trivial"))
    jobs = len(benchmarks) * args.trials_per_benchmark
    wall = {name: min(run[0] for run in timed_runs) for name, timed_runs in runs.items()}
    cpu = {name: min(run[1] for run in timed_runs) for name, timed_runs in runs.items()}
    print(f"trials planned: {jobs}; minimum of {args.repeats} runs each")
    for name in runs:
        print(f"{name:8s} workflow  snakemake -n: {wall[name]:7.2f} s wall, {cpu[name]:7.2f} s CPU")
    print(f"ratio project / trivial: {wall['project'] / wall['trivial']:.2f} wall (goal <= 1.5)")
    print(f"ratio project / trivial: {cpu['project'] / cpu['trivial']:.2f} CPU")


if __name__ == "__main__":
    main()
