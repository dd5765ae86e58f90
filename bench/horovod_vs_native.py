"""Native collectives vs Horovod: the same 1x2 trials with backend native and backend horovod, side by side.

Each cell (benchmark x framework x precision x gradient compression) runs as a real 2-process trial, started as
the trial job starts it: the system's launcher (local-cpu: torch.distributed.run for native, horovodrun for
horovod) and the trial program (python -m mlcampaign.trial). Native is DistributedDataParallel over gloo (torch) or
MultiWorkerMirroredStrategy (TensorFlow); Horovod is its Gloo build (envs/horovod/build.py). The two backends of a
cell alternate (native, horovod, then horovod, native, ...: bench/_common.interleaved), so that neither always
runs first.

Throughput is the record's: global samples / rank 0's training-step wall time over every step after the trial's
``warmup_steps`` (warm-up excluded inside each trial, no launch is discarded), data loading included, evaluation
excluded; the median over rounds is printed. Ratio = Horovod throughput / native throughput (above 1: Horovod
is faster). Communication per step is the record's ``communication_s`` over the measured steps: for native torch
only the all-reduce not hidden behind backward (DDP overlaps it), for the others the whole blocking all-reduce
after backward, waiting for the slower rank included (COMMUNICATION_METHODS in mlcampaign/trial/protocol.py).

The benchmarks are the CPU-sized variants of the default campaign on the bench's small splits (SMALL_SPLITS in
bench/_common.py: same sample size, format and model), ``--epochs`` epochs each (2-3 steps an epoch), evaluated
once at the end, with an unreachable target so that every epoch runs. TensorFlow's ResNet-50 is
keras.applications' (full bottleneck width: the campaign's CPU-sized width 16 has no Keras model).

Exits non-zero if a trial fails (its record's reason is printed); a slower backend is a printed figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from _common import CONTENTION_NOTE, DEFAULT_CONFIG, REPO, SMALL_SPLITS, interleaved, staged_dataset

from mlcampaign.job.launch import TRIAL_PROGRAM, launch_argv, trial_environment
from mlcampaign.plan.config import deep_merge, load_campaign
from mlcampaign.records.files import read_record

# The benchmarks with a Horovod cell in each framework.
CELLS = {"torch": ["resnet50-synthetic", "cosmoflow", "deepcam"], "tensorflow": ["resnet50-synthetic", "cosmoflow"]}
KERAS_RESNET50 = {"model": {"options": {"width_per_group": 64}}}
UNREACHABLE = {"higher": 1.01, "lower": 0.0}
BACKENDS = ("native", "horovod")


def cell_spec(benchmark: str, framework: str, backend: str, precision: str, compression: str, epochs: int) -> dict:
    """The default campaign's 1x2 trial spec of one cell, on the bench's small split."""
    config = yaml.safe_load(DEFAULT_CONFIG.read_text())
    overrides = deep_merge(
        config.get("benchmark_overrides", {}).get(benchmark, {}), {"dataset": SMALL_SPLITS[benchmark]}
    )
    if framework == "tensorflow" and benchmark.startswith("resnet50"):
        overrides = deep_merge(overrides, KERAS_RESNET50)
    overrides = deep_merge(overrides, {"training": {"epochs_max": epochs, "eval_every": epochs, "warmup_steps": 2}})
    config |= {
        "benchmarks": [benchmark],
        "trials": 1,
        "matrix": {
            "scales": ["1x2"],
            "precisions": [precision],
            "compressions": [compression],
            "frameworks": [framework],
            "backends": [backend],
        },
        "benchmark_overrides": {benchmark: overrides},
    }
    campaign = load_campaign(config, REPO / "config", source=str(DEFAULT_CONFIG))
    spec = campaign.trial_spec(next(campaign.trials()), "bench", "local")
    target = spec["benchmark"]["target"]
    target["value"] = UNREACHABLE[target["direction"]]
    return spec


def run_launched(spec: dict, dataset_id: Path, out: Path) -> dict:
    """One trial through the system's launcher, as the trial job starts it; its record."""
    out.mkdir(parents=True)
    (out / "spec.json").write_text(json.dumps(spec))
    argv = [*launch_argv(spec["system"], spec["trial"], sys.executable), *TRIAL_PROGRAM]
    argv += ["--spec-file", str(out / "spec.json"), "--dataset-id", str(dataset_id)]
    argv += ["--record", str(out / "record.json"), "--mllog", str(out / "mllog.txt")]
    with open(out / "trial.log", "w") as log:
        subprocess.run(
            argv, stdout=log, stderr=subprocess.STDOUT, timeout=1800, check=False, env=trial_environment(os.environ)
        )
    if not (out / "record.json").exists():
        raise RuntimeError(f"{' '.join(argv)} wrote no record; its log: {out / 'trial.log'}")
    return read_record(out / "record.json")


def per_step_ms(record: dict) -> float:
    metrics = record["metrics"]
    measured = metrics["samples_trained"] // record["benchmark"]["global_batch_size"] - metrics["warmup_steps_excluded"]
    return 1e3 * metrics["communication_s"] / measured


def measure_cell(
    benchmark: str, framework: str, precision: str, compression: str, args, workdir: Path
) -> tuple[dict, list[tuple]]:
    """Both backends of one cell, interleaved: the row of the table, and the failed trials."""
    specs = {
        backend: cell_spec(benchmark, framework, backend, precision, compression, args.epochs) for backend in BACKENDS
    }
    dataset_id = staged_dataset(specs["native"], workdir / "datasets")
    cell = specs["horovod"]["trial"]["cell"]
    records: dict[str, list[dict]] = {backend: [] for backend in BACKENDS}

    def launcher(backend: str):
        def launch() -> None:
            out = workdir / benchmark / cell / f"{backend}{len(records[backend])}"
            records[backend].append(run_launched(specs[backend], dataset_id, out))

        return launch

    launches = interleaved({backend: launcher(backend) for backend in BACKENDS}, rounds=args.rounds, warmup=0)
    row = {"benchmark": benchmark, "framework": framework, "precision": precision, "compression": compression}
    row["cell"], failures = cell, []
    for backend in BACKENDS:
        ok = [record for record in records[backend] if record["status"] == "ok"]
        failures += [(cell, backend, record["failure"]) for record in records[backend] if record["status"] != "ok"]
        row[backend] = {
            "throughput": statistics.median(r["metrics"]["throughput_samples_per_s"] for r in ok) if ok else None,
            "comm_ms": statistics.median(per_step_ms(r) for r in ok) if ok else None,
            "consistent": bool(ok) and all(r["distributed"]["weights_consistent"] for r in ok),
            "launch_s": statistics.median(launches[backend]["wall"]),
        }
    native, horovod = row["native"]["throughput"], row["horovod"]["throughput"]
    row["ratio"] = horovod / native if native and horovod else None
    return row, failures


def _figure(value: float | None, spec: str = ".1f") -> str:
    return "failed" if value is None else format(value, spec)


def print_table(rows: list[dict]) -> None:
    columns = ["benchmark", "framework", "precision", "grad compression", "native samples/s", "horovod samples/s"]
    columns += ["horovod/native", "native comm ms/step", "horovod comm ms/step", "weights equal n/h", "launch s n/h"]
    lines = [columns]
    for row in rows:
        native, horovod = row["native"], row["horovod"]
        lines.append(
            [
                row["benchmark"],
                row["framework"],
                row["precision"],
                row["compression"],
                _figure(native["throughput"]),
                _figure(horovod["throughput"]),
                _figure(row["ratio"], ".3f"),
                _figure(native["comm_ms"]),
                _figure(horovod["comm_ms"]),
                f"{native['consistent']}/{horovod['consistent']}",
                f"{native['launch_s']:.0f}/{horovod['launch_s']:.0f}",
            ]
        )
    widths = [max(len(line[index]) for line in lines) for index in range(len(columns))]
    for line in lines:
        print(
            "  ".join(
                text.rjust(width) if index >= 4 else text.ljust(width)
                for index, (text, width) in enumerate(zip(line, widths, strict=True))
            )
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frameworks", nargs="+", default=list(CELLS), choices=list(CELLS))
    parser.add_argument("--benchmarks", nargs="+", help="default: every benchmark with a Horovod cell")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--compressions", nargs="+", default=["none", "fp16"], choices=["none", "fp16"])
    parser.add_argument("--rounds", type=int, default=1, help="launches of each backend per cell")
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="horovod-vs-native-"))
    rows, failures = [], []
    for framework in args.frameworks:
        for benchmark in [name for name in args.benchmarks or CELLS[framework] if name in CELLS[framework]]:
            for precision in args.precisions:
                for compression in args.compressions:
                    row, failed = measure_cell(benchmark, framework, precision, compression, args, workdir)
                    rows.append(row)
                    failures += failed
                    print(json.dumps(row), flush=True)

    print(f"\n1x2 trials on local-cpu, {args.rounds} launch(es) per backend and cell; {CONTENTION_NOTE}")
    print_table(rows)
    ratios = [row["ratio"] for row in rows if row["ratio"] is not None]
    if ratios:
        print(f"\nHorovod / native throughput: median {statistics.median(ratios):.3f} over {len(ratios)} cells")
    for cell, backend, failure in failures:
        print(f"FAILED {cell} ({backend}): {failure['reason']}: {failure['message']}")
    print(f"trials, records and logs: {workdir}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
