"""Roofline: each benchmark's training step as a fraction of this machine's measured matmul peak.

    .venv/bin/python bench/roofline.py [--epochs 3]

Runs a short real trial of each benchmark of the default campaign (mlcampaign.trial.protocol.run_trial on the
small splits of bench/_common.py, ``--epochs`` epochs, 1 warm-up step excluded from throughput) and
prints what its record holds: ``roofline`` (the matmul peak the trial process measured before
training, mlcampaign.measure.roofline, and the achieved fraction) next to ``flops`` (counted FLOPs per
sample x throughput, and the fraction of the system config's nominal peak). The peak is measured
once more after each trial: on a shared machine the two differ, which bounds how far to trust the
fraction.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from _common import CONTENTION_NOTE, SMALL_SPLITS, staged_dataset, trial_spec

from mlcampaign.trial.distributed import detect_layout
from mlcampaign.trial.protocol import measure_process_roof, run_trial


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3, help="training epochs of each short trial")
    args = parser.parse_args()
    print(f"torch {torch.__version__}; {CONTENTION_NOTE} (peak and step alike)")
    with tempfile.TemporaryDirectory(prefix="bench-roofline-") as tmp:
        for benchmark in SMALL_SPLITS:
            spec = trial_spec(benchmark, {"training": {"epochs_max": args.epochs, "warmup_steps": 1}})
            out = Path(tmp) / benchmark
            record = run_trial(
                spec, staged_dataset(spec, Path(tmp) / "datasets"), out / "record.json", out / "mllog.txt"
            )
            if record["status"] != "ok":
                raise SystemExit(f"{benchmark}: the trial failed: {record['failure']}")
            flops, roofline = record["flops"], record["roofline"]
            print(
                f"{benchmark}: {flops['train_per_sample'] / 1e9:.3f} GFLOP per training sample (counted), "
                f"{record['metrics']['throughput_samples_per_s']:.2f} samples/s "
                f"-> achieved {flops['achieved_flops_per_s'] / 1e9:.2f} GFLOP/s"
            )
            print(f"  measured peak {roofline['peak_flops_per_s'] / 1e9:.1f} GFLOP/s ({roofline['measured_with']})")
            # The same measurement after training: how far the machine's speed moved during the trial.
            again = measure_process_roof(spec, detect_layout()).flops_per_s
            print(f"  the same peak measured again after the trial: {again / 1e9:.1f} GFLOP/s")
            print(
                f"  fraction of the measured peak (record roofline.achieved_fraction): "
                f"{roofline['achieved_fraction']:.3f}"
            )
            nominal = record["system"]["peak_flops_per_s"]
            if nominal:
                print(
                    f"  fraction of the nominal peak {nominal / 1e9:.1f} GFLOP/s (system config; record "
                    f"flops.fraction_of_peak): {flops['fraction_of_peak']:.3f}"
                )


if __name__ == "__main__":
    main()
