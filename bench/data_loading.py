"""Data loading: each benchmark's reader delivers samples at >= 3x the rate training consumes them (goal).

    .venv/bin/python bench/data_loading.py [--rounds 3]

For each dataset format of the benchmarks (CPU-sized, small splits: bench/_common.py), on the trial's own
loader (``TorchTrial.train_loader``: reader, batch size, sampler, ``data_workers``):
- reader rate: samples/s of one pass over the loader alone (read, decode, normalise, collate);
- training rate: samples/s the training step consumes, i.e. measured samples / the trial's
  ``compute_s`` (its own step timers, data loading excluded, its declared warm-up steps excluded).
Reader passes and training epochs alternate; the first round of each is warm-up and not counted.
Ratio = reader rate / training rate.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from _common import CONTENTION_NOTE, interleaved, ready_trial, trial_spec

from mlcampaign.plan.registry import data_formats

GOAL = 3.0
# (benchmark, overrides): every reader of the benchmarks measured (bench/_common.py), and CosmoFlow's
# HDF5 variant of its TFRecord set.
READERS = [
    ("resnet50-synthetic", {}),
    ("cosmoflow", {}),
    ("cosmoflow", {"dataset": {"name": "bench-cosmoflow-32-hdf5", "format": "cosmoflow_hdf5"}}),
    ("deepcam", {}),
    ("extreme-weather", {}),
]


def measure(benchmark: str, overrides: dict, rounds: int, datasets_dir: Path, workdir: Path) -> dict:
    trial = ready_trial(trial_spec(benchmark, overrides), datasets_dir, workdir)
    samples_read = []

    def read_pass() -> None:
        samples_read.append(sum(len(inputs) for inputs, _ in trial.train_loader))

    epochs = iter(range(1, 10**6))
    seconds = interleaved(
        {"read": read_pass, "train": lambda: trial.train_epoch(next(epochs))},
        rounds=rounds,
    )
    trial.close()
    reader_rate = sum(samples_read[1:]) / sum(seconds["read"]["wall"])
    training_rate = trial.counters.measured_samples / trial.counters.compute_s
    return {
        "format": trial.benchmark["dataset"]["format"],
        "reader_samples_per_s": reader_rate,
        "training_samples_per_s": training_rate,
        "measured_training_steps": trial.counters.measured_steps,
        "data_workers": trial.training["data_workers"],
        "ratio": reader_rate / training_rate,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="timed reader passes and epochs, after one warm-up each")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads; {CONTENTION_NOTE}")
    print(f"warm-up: 1 pass and 1 epoch excluded, and the trial's warm-up steps; {args.rounds} timed rounds")
    measured = set()
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        for benchmark, overrides in READERS:
            result = measure(benchmark, overrides, args.rounds, Path(tmp) / "datasets", Path(tmp))
            print(
                f"{benchmark} ({result['format']}, {result['data_workers']} loader workers): reader "
                f"{result['reader_samples_per_s']:.1f} samples/s, training consumes "
                f"{result['training_samples_per_s']:.1f} samples/s ({result['measured_training_steps']} steps); "
                f"ratio {result['ratio']:.1f} (goal >= {GOAL:g})"
            )
            measured.add(result["format"])
    missing = sorted(set(data_formats()) - measured)
    print(f"dataset formats of the registry (mlcampaign.plan.registry) not measured: {missing}")


if __name__ == "__main__":
    main()
