"""Canaries: what measuring the machine costs a trial, and how noisy each canary is.

    .venv/bin/python bench/canaries.py [--trials 7] [--benchmark cosmoflow]

Each trial is a fresh process (two for the 1x2 cell, started with torchrun's variables: a gloo group) that
measures the canaries exactly as a trial process does: the real trial object (mlcampaign.trial.protocol.TrialRun
of the default campaign's first trial of ``--benchmark``, its real dataset) measures its roofline, then its
canaries in their three phases (``measure_canaries``: with the roofline before set-up, after ``prepare`` right
before the timed training, after it), each phase timed. The training itself is left out: it costs the same with or
without canaries. 1x1 and 1x2 trials alternate.

Printed per canary: its cost per trial (median and quartiles over the trials; the matmul canary is the roofline
every trial measures anyway, so it adds nothing: the roofline's own cost is printed beside it), its repeat noise
(median of the readings' repeat_cv: the spread of the timed repeats within one trial) and its run-to-run CV (sd /
mean of its value over the trial processes: what a cell's history sees from trial to trial). Goal: all canaries
together <= 1 s a trial on CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from _common import CONTENTION_NOTE, DEFAULT_CONFIG, REPO, staged_dataset

from mlcampaign.measure.canaries.probe import AFTER_TIMED, BEFORE_SETUP, BEFORE_TIMED, probes
from mlcampaign.plan.canaries import CANARIES
from mlcampaign.plan.config import load_campaign

GOAL_S = 1.0
PHASES = (BEFORE_SETUP, BEFORE_TIMED, AFTER_TIMED)
ROOFLINE = "roofline (reused by the matmul canary)"


def trial_specs(benchmark: str) -> dict[str, dict]:
    """The default campaign's first trial of ``benchmark`` at 1x1 and at 1x2 (fp32), by scale."""
    config = yaml.safe_load(DEFAULT_CONFIG.read_text())
    config |= {"benchmarks": [benchmark], "matrix": {"scales": ["1x1", "1x2"], "precisions": ["fp32"]}}
    config.pop("matrix_overrides", None)
    campaign = load_campaign(config, REPO / "config", source=str(DEFAULT_CONFIG))
    specs = {}
    for row in campaign.trials():
        specs.setdefault(row["cell"].split("-")[0], campaign.trial_spec(row, "bench", "local"))
    return specs


def worker(spec_path: Path, id_path: Path, out_path: Path) -> None:
    """One trial process: its roofline and canaries, each phase timed; rank 0 writes them to ``out_path``."""
    from mlcampaign.trial.distributed import detect_layout
    from mlcampaign.trial.protocol import measure_process_roof, trial_class

    spec = json.loads(spec_path.read_text())
    layout = detect_layout()
    trial = trial_class(spec["trial"]["framework"])(spec, layout, id_path, out_path.with_suffix(".mllog"))
    costs = {}
    start = time.perf_counter()
    peak = measure_process_roof(spec, layout)
    costs[ROOFLINE] = time.perf_counter() - start
    for phase in PHASES:
        if phase == BEFORE_TIMED:
            trial.prepare()  # set-up (data, model, the process group): not the canaries' cost
        start = time.perf_counter()
        trial.measure_canaries(phase, peak if phase == BEFORE_SETUP else None)
        costs[phase] = time.perf_counter() - start
    trial.close()
    if layout.is_main:
        readings = {name: dataclasses.asdict(reading) for name, reading in trial.canaries.items()}
        out_path.write_text(json.dumps({"costs": costs, "readings": readings}))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_trial_processes(spec: dict, id_path: Path, workdir: Path, index: int) -> dict:
    """Start the trial's processes (torchrun's variables for more than one) and return rank 0's figures."""
    processes = spec["trial"]["processes"]
    tag = f"{spec['trial']['cell']}-{index}"
    spec_path, out_path = workdir / f"{tag}.spec.json", workdir / f"{tag}.json"
    spec_path.write_text(json.dumps(spec))
    argv = [sys.executable, __file__, "--worker", str(spec_path), str(id_path), str(out_path)]
    port = _free_port()
    children = []
    for rank in range(processes):
        environment = os.environ | {"PYTHONPATH": str(REPO)}
        if processes > 1:
            environment |= {
                "RANK": str(rank),
                "WORLD_SIZE": str(processes),
                "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(processes),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            }
        children.append(subprocess.Popen(argv, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    for child in children:
        _, errors = child.communicate(timeout=600)
        if child.returncode != 0:
            raise SystemExit(f"{tag}: a trial process failed:\n{errors.decode()[-3000:]}")
    return json.loads(out_path.read_text())


def _quartiles(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.3f} s"
    low, median, high = statistics.quantiles(values, n=4, method="inclusive")
    return f"{median:.3f} s (quartiles {low:.3f}-{high:.3f})"


def report(cell: str, results: list[dict]) -> None:
    """Cost, repeat noise and run-to-run CV of each canary of ``cell``'s trials, and their total cost."""
    phase_of = {name: probe.phase for name, probe in probes().items()}
    print(f"\n{cell}: {len(results)} trial processes")
    roofline = [result["costs"][ROOFLINE] for result in results]
    print(f"  {ROOFLINE}: {_quartiles(roofline)} a trial, paid by every trial with or without canaries")
    for name, canary in CANARIES.items():
        readings = [result["readings"][name] for result in results if name in result["readings"]]
        if not readings:
            print(f"  {name}: not measured in this cell")
            continue
        values = [reading["value"] for reading in readings]
        # A phase holds one probe besides the reused matmul canary, which costs nothing: the phase's cost is its.
        costs = [0.0] * len(results) if name == "matmul_flops_per_s" else [r["costs"][phase_of[name]] for r in results]
        run_cv = statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else float("nan")
        print(
            f"  {name}: cost {_quartiles(costs)}; median {statistics.median(values):.4g} {canary.unit}; "
            f"repeat CV {statistics.median(reading['repeat_cv'] for reading in readings):.1%} (median); "
            f"run-to-run CV {run_cv:.1%}"
        )
    totals = [sum(result["costs"][phase] for phase in PHASES) for result in results]
    total = statistics.median(totals)
    print(
        f"  all canaries: {_quartiles(totals)} a trial beyond the roofline "
        f"(goal <= {GOAL_S:.0f} s: {'met' if total <= GOAL_S else 'missed'}, ratio {total / GOAL_S:.2f})"
    )
    print("  how each was measured (the last trial's readings):")
    for name, reading in results[-1]["readings"].items():
        print(f"    {name}: {reading['method']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=7, help="trial processes per cell")
    parser.add_argument("--benchmark", default="cosmoflow", help="a benchmark of the default campaign")
    parser.add_argument("--worker", nargs=3, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    specs = trial_specs(args.benchmark)
    print(f"{args.benchmark}, the default campaign's dataset; {os.cpu_count()} CPUs; {CONTENTION_NOTE}")
    results: dict[str, list[dict]] = {cell: [] for cell in specs}
    with tempfile.TemporaryDirectory(prefix="bench-canaries-") as tmp:
        id_path = staged_dataset(specs["1x1"], Path(tmp) / "datasets")
        for index in range(args.trials):
            for cell, spec in specs.items():
                results[cell].append(run_trial_processes(spec, id_path, Path(tmp), index))
    for cell, cell_results in results.items():
        report(cell, cell_results)


if __name__ == "__main__":
    main()
