"""Campaign overhead: a local campaign's wall time vs the sum of its trials' training time.

    .venv/bin/python bench/campaign_overhead.py [--trials 3] [--repeats 1] [--benchmark resnet50-synthetic]
    .venv/bin/python bench/campaign_overhead.py --compare-roofline 10

Runs a small campaign (``--benchmark``, resnet50-synthetic by default, CPU-sized as the default
campaign has it, on the bench's small split, 2 epochs a trial) with the real CLI, ``snakemake
--profile profiles/local`` in a fresh directory: staging, trials, trials table, analysis tables,
figures, report, results store and dashboard. A trial's training time is its record's
``metrics.time_to_train_s`` (MLPerf run_start to run_stop, evaluation included).

Snakemake's output (start and finish of every job, timed as its lines arrive) splits the wall time
into wall = sum(training) + n x k + c:
- ``k``: each trial job's time beyond its training (process start, Python and library imports,
  dataset verification, model set-up, FLOP counting, the roofline measurements, record writing);
- ``c``: the campaign's fixed cost (Snakemake start and planning, staging, aggregation, figures,
  report, store and dashboard, and the scheduling gaps between jobs).
Goal: k <= 2 s and c <= 8 s on a 2-core machine; then wall <= 1.05 x sum(training) + c holds for
trials that train at least k / 0.05 = 20 k seconds.

The campaign's trials take a lock of their own (MLCAMPAIGN_LOCK_DIR in a temporary directory), not the
machine's: on a shared machine they would otherwise wait, inside their jobs, for other people's trials
to finish, and count that wait as k. Other work on the machine still slows every part; ``--repeats``
runs the campaign several times and prints each run's figures and their spread, and the quietest
run (least wall time) is the one closest to an idle machine's. Last, the floor of k: a Python process
that imports torch and torch._dynamo (which every torch optimizer imports when it is built) and ends as
the trial process does (``os._exit``), which every trial process pays; and k split into the trial job's
own part and the trial process's, by running one trial's program alone again.

``--compare-roofline N`` instead times N interleaved pairs of the trial's matmul roof (mlcampaign.measure.roofline,
now 1 warm-up and 5 timed rounds of 40 ms) and the measurement it replaced (2 warm-up and 5 timed rounds
of 100 ms), and prints both medians, their spread and their cost.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from _common import CONTENTION_NOTE, DEFAULT_CONFIG, REPO, SMALL_SPLITS

from mlcampaign.job.launch import TRIAL_PROGRAM, launch_argv, trial_environment
from mlcampaign.plan.config import deep_merge

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
BENCHMARK = "resnet50-synthetic"
GOAL = 1.05
GOAL_K_S, GOAL_C_S = 2.0, 8.0
# What every torch trial process imports before it trains a step (import_floor).
FLOOR_MODULES = "torch, torch._dynamo"
# The roofline measurement before 2026-12 (mlcampaign.measure.roofline), for --compare-roofline.
PREVIOUS_ROOFLINE = {"repeats": 5, "warmup": 2, "round_s": 0.1}


def campaign(trials: int, benchmark: str = BENCHMARK) -> dict:
    """The bench's campaign: ``benchmark`` as the default campaign sizes it for a CPU (its
    benchmark_overrides), on the bench's small split, 2 epochs a trial."""
    cpu_sized = yaml.safe_load(DEFAULT_CONFIG.read_text())["benchmark_overrides"].get(benchmark, {})
    bench_sized = {"dataset": SMALL_SPLITS[benchmark], "training": {"epochs_max": 2}}
    return {
        "campaign": f"bench-overhead-{trials}",
        "seed": 1,
        "trials": trials,
        "systems": ["local-cpu"],
        "benchmarks": [benchmark],
        "matrix": {"scales": ["1x1"], "precisions": ["fp32"]},
        "benchmark_overrides": {benchmark: deep_merge(cpu_sized, bench_sized)},
    }


def job_seconds(lines: list[tuple[float, str]]) -> dict[str, list[float]]:
    """Wall seconds of every finished job, by rule, from Snakemake's output lines as they arrived (time,
    line): a job starts when Snakemake prints its block (its ``jobid:`` line) and ends when it prints
    ``Finished jobid``. (Its log file stamps lines to the second only.)"""
    started, seconds = {}, {}
    for stamp, line in lines:
        if job := re.fullmatch(r"\s+jobid: (\S+)", line):
            started[job.group(1)] = stamp
        elif finished := re.match(r"Finished jobid: (\S+) \(Rule: (\S+)\)", line):
            job_id, rule = finished.groups()
            seconds.setdefault(rule, []).append(stamp - started[job_id])
    return seconds


def run_campaign(trials: int, workdir: Path, benchmark: str = BENCHMARK) -> dict:
    config = campaign(trials, benchmark)
    configfile = workdir / "campaign.yaml"
    configfile.write_text(yaml.safe_dump(config))
    command = [SNAKEMAKE, "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir)]
    command += ["--profile", str(REPO / "profiles" / "local"), "--configfile", str(configfile)]
    environment = os.environ | {"MLCAMPAIGN_LOCK_DIR": str(workdir / "lock")}  # the module's docstring says why
    lines = []
    start = time.perf_counter()
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment
    ) as process:
        for line in process.stdout:
            lines.append((time.perf_counter(), line.rstrip("\n")))
    wall = time.perf_counter() - start
    if process.returncode != 0:
        output = "\n".join(line for _, line in lines[-60:])
        raise SystemExit(f"{' '.join(command)} failed:\n{output}")
    records = [json.loads(path.read_text()) for path in (workdir / "results" / config["campaign"]).rglob("record.json")]
    if len(records) != trials or any(record["status"] != "ok" for record in records):
        raise SystemExit(f"expected {trials} ok records in {workdir}, found {[r['status'] for r in records]}")
    return {
        "trials": trials,
        "wall": wall,
        "training": sum(record["metrics"]["time_to_train_s"] for record in records),
        "jobs": job_seconds(lines),
    }


def split(run: dict) -> dict:
    """k and c of one campaign run, and the jobs c is made of (seconds)."""
    n, wall, training, jobs = run["trials"], run["wall"], run["training"], run["jobs"]
    trial_jobs = sum(jobs["trial"])
    per_trial = (trial_jobs - training) / n
    fixed = wall - training - n * per_trial
    other_jobs = {rule: sum(seconds) for rule, seconds in sorted(jobs.items()) if rule != "trial"}
    return {"k": per_trial, "c": fixed, "trial_jobs": trial_jobs, "other_jobs": other_jobs} | run


def print_run(figures: dict) -> None:
    n, wall, training = figures["trials"], figures["wall"], figures["training"]
    other = ", ".join(f"{rule} {seconds:.0f} s" for rule, seconds in figures["other_jobs"].items())
    gaps = figures["c"] - sum(figures["other_jobs"].values())
    print(f"{n} trials: wall {wall:.1f} s, sum of training {training:.1f} s ({training / n:.1f} s a trial)")
    print(f"  ratio wall / sum(training): {wall / training:.2f} (goal <= {GOAL} + a small constant)")
    print(
        f"  k = (trial jobs {figures['trial_jobs']:.0f} s - training) / {n} = {figures['k']:.1f} s per trial beyond "
        f"training (goal <= {GOAL_K_S:.0f} s)"
    )
    print(
        f"  c = wall - training - n k = {figures['c']:.1f} s per campaign (goal <= {GOAL_C_S:.0f} s); its jobs: "
        f"{other}; Snakemake itself and the gaps between jobs: {gaps:.1f} s"
    )
    print(
        f"  wall <= {GOAL} x sum(training) + c holds for trials training >= k / {GOAL - 1:.2f} = "
        f"{figures['k'] / (GOAL - 1):.0f} s each"
    )


def import_floor(runs: int) -> dict[str, float]:
    """Median wall seconds of a Python process that imports torch (and torch._dynamo) and ends as the trial
    process does (``os._exit``, without Python's teardown of the libraries): what every torch trial process
    pays before anything of the trial runs. torch._dynamo is imported by every torch.optim optimizer's
    constructor on its first call (torch._compile._disable_dynamo) and by torchvision.ops at import, so
    every training process pays for it; torchvision itself adds little beyond it."""
    seconds: dict[str, list[float]] = {"torch": [], FLOOR_MODULES: []}
    for _ in range(runs):
        for modules in seconds:
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", f"import os, {modules}; os._exit(0)"], check=True)
            seconds[modules].append(time.perf_counter() - start)
    return {modules: statistics.median(values) for modules, values in seconds.items()}


def trial_process_alone(workdir: Path) -> dict[str, float]:
    """One of the campaign's trials run again by its trial program alone (``python -m mlcampaign.trial``, as the
    supervisor starts it, with a record of its own elsewhere): its process's wall seconds and its training's.
    What a trial job takes beyond that process is the job's own (Snakemake's script start, the supervisor)."""
    spec_file = next(workdir.rglob("spec.json"))
    spec = json.loads(spec_file.read_text())
    dataset_id = workdir / "results" / "datasets" / spec["benchmark"]["dataset"]["name"] / "dataset_id"
    record = workdir / "alone" / "record.json"
    command = [*launch_argv(spec["system"], spec["trial"], sys.executable), *TRIAL_PROGRAM]
    command += ["--spec-file", str(spec_file), "--dataset-id", str(dataset_id)]
    command += ["--record", str(record), "--mllog", str(record.with_name("mllog.txt"))]
    record.parent.mkdir()
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, env=trial_environment(os.environ))
    wall = time.perf_counter() - start
    return {"process": wall, "training": json.loads(record.read_text())["metrics"]["time_to_train_s"]}


def compare_roofline(pairs: int) -> None:
    """Interleaved pairs of the trial's roofline measurement and the previous one (the module's docstring)."""
    import torch

    from mlcampaign.measure.roofline import measure_matmul_peak

    torch.set_num_threads(os.cpu_count() or 1)
    measure_matmul_peak()  # the process's first matmuls pay for library set-up; neither side should
    results = {"now": {"gflops": [], "s": []}, "before": {"gflops": [], "s": []}}
    for pair in range(pairs):
        for name in ("now", "before") if pair % 2 == 0 else ("before", "now"):  # neither always first
            start = time.perf_counter()
            peak = measure_matmul_peak() if name == "now" else measure_matmul_peak(**PREVIOUS_ROOFLINE)
            results[name]["s"].append(time.perf_counter() - start)
            results[name]["gflops"].append(peak.flops_per_s / 1e9)
    print(f"roofline, {pairs} interleaved pairs, torch.matmul 1024² fp32, {torch.get_num_threads()} threads:")
    for name, label in (("now", "1 warm-up + 5 x 40 ms"), ("before", "2 warm-up + 5 x 100 ms")):
        gflops, seconds = results[name]["gflops"], results[name]["s"]
        print(
            f"  {label:22s}: median {statistics.median(gflops):.1f} GFLOP/s (min {min(gflops):.1f}, max "
            f"{max(gflops):.1f}), {statistics.median(seconds):.2f} s a measurement"
        )
    ratios = [now / before for now, before in zip(results["now"]["gflops"], results["before"]["gflops"], strict=True)]
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    print(
        f"  now / before, per pair: median {statistics.median(ratios):.3f} "
        f"(quartiles {quartiles[0]:.3f}..{quartiles[2]:.3f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3, help="trials of the campaign")
    parser.add_argument("--repeats", type=int, default=1, help="campaign runs, each in a fresh directory")
    parser.add_argument("--benchmark", default=BENCHMARK, choices=sorted(SMALL_SPLITS), help="the campaign's benchmark")
    parser.add_argument("--compare-roofline", type=int, default=0, metavar="N", help="only compare the roofline")
    args = parser.parse_args()
    if args.compare_roofline:
        compare_roofline(args.compare_roofline)
        return
    print(f"{CONTENTION_NOTE}; on a shared machine every part below is slowed alike, roughly")
    runs = []
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="bench-campaign-") as tmp:
            runs.append(split(run_campaign(args.trials, Path(tmp), args.benchmark)))
            runs[-1]["alone"] = trial_process_alone(Path(tmp))
        if args.repeats > 1:
            print(f"run {repeat + 1} of {args.repeats}:")
        print_run(runs[-1])
    quietest = min(runs, key=lambda run: run["wall"])
    if args.repeats > 1:
        for name in ("k", "c", "wall"):
            values = sorted(run[name] for run in runs)
            print(
                f"{name}: "
                + ", ".join(f"{value:.1f}" for value in values)
                + f" s (median {statistics.median(values):.1f})"
            )
        print(f"quietest run (least wall time): k = {quietest['k']:.1f} s, c = {quietest['c']:.1f} s")
    floor = import_floor(3)
    print(
        "the floor of k, a process that imports and ends as the trial's does (median of 3): "
        + ", ".join(f"import {modules}: {seconds:.2f} s" for modules, seconds in floor.items())
    )
    alone = quietest["alone"]
    process_k = alone["process"] - alone["training"]
    imports = floor[FLOOR_MODULES]
    print(
        f"k of the quietest run split: the trial job's own (Snakemake's script start, the supervisor) "
        f"{quietest['k'] - process_k:.1f} s; the trial process beyond training {process_k:.1f} s "
        f"(its process alone: {alone['process']:.1f} s, training {alone['training']:.1f} s), of which its "
        f"imports {imports:.1f} s and the trial's own work {process_k - imports:.1f} s"
    )


if __name__ == "__main__":
    main()
