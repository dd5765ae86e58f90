"""Harness overhead: a trial's training epoch (mlcampaign's TorchTrial) vs a bare PyTorch loop (goal >= 0.99).

    .venv/bin/python bench/harness_overhead.py [--benchmarks resnet50-synthetic deepcam] [--rounds 6]

Both train the same model (the bare loop a copy of the trial's, same initial weights), with the same
optimizer settings, loss, batch size and dataset reader, on the same process and threads. The trial
epoch is ``TorchTrial.train_epoch``: its loader (distributed sampler), device copies, per-step
timers, divergence check, grad scaler, LR schedule and step bookkeeping. The bare loop is what one
writes by hand: a shuffling DataLoader, zero_grad, forward, loss, backward, optimizer step.

Epochs alternate (trial, bare, bare, trial, ...) so that machine noise hits both alike; the first
round of each is warm-up and is not counted. Ratio = bare epoch time / trial epoch time = trial
throughput / bare throughput (1.0: no overhead), per round from wall time and from this process's
CPU time; printed: the median over rounds and its quartiles (on a shared machine single epochs
stall for seconds when another process bursts, so totals would measure the neighbours). Then 4 more
trial epochs under cProfile give the time spent in the harness's own Python per step (timers,
finiteness check, schedule, scaler, sampler, bookkeeping), a figure the neighbours barely move.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import pstats
import statistics
import tempfile
from pathlib import Path

import torch
from _common import CONTENTION_NOTE, SMALL_SPLITS, bare_loader, interleaved, ready_trial, trial_spec

from mlcampaign.trial.torch.trial import map_tensors

GOAL = 0.99


def bare_epoch(model, optimizer, criterion, loader, device, forward_takes_targets: bool) -> None:
    model.train()
    for inputs, targets in loader:
        inputs, targets = inputs.to(device), map_tensors(lambda tensor: tensor.to(device), targets)
        optimizer.zero_grad(set_to_none=True)
        outputs = model(inputs, targets) if forward_takes_targets else model(inputs)  # detection: loss dict
        loss = criterion(outputs, targets)
        loss.backward()
        optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# Where the harness's own per-step Python lives (the trial loop and its timers, collectives, deadline,
# LR schedule, grad scaler, sampler).
HARNESS_CODE = (
    "mlcampaign/trial/protocol.py",
    "mlcampaign/trial/torch/trial.py",
    "mlcampaign/trial/torch/collectives.py",
    "mlcampaign/plan/hyperparameters.py",
    "mlcampaign/job/deadlines.py",
    "torch/optim/lr_scheduler.py",
    "torch/amp/grad_scaler.py",
    "torch/utils/data/distributed.py",
)


def harness_code_ms_per_step(trial, epochs) -> tuple[float, float]:
    """(ms of the harness's own Python per step, ms of a whole step) under cProfile over 4 trial epochs.

    Own time only (``tottime``): the torch operators they call are not counted, the profiler's own
    cost per call is, so the first figure is an upper bound; independent of what else runs."""
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(4):
        trial.train_epoch(next(epochs))
    profile.disable()
    stats = pstats.Stats(profile).stats  # (file, line, function) -> (calls, primitive calls, tottime, ...)
    steps = 4 * trial.steps_per_epoch
    own = sum(entry[2] for (path, _, _), entry in stats.items() if any(part in path for part in HARNESS_CODE))
    return own / steps * 1e3, sum(entry[2] for entry in stats.values()) / steps * 1e3


def measure(benchmark: str, rounds: int, datasets_dir: Path, workdir: Path) -> dict:
    trial = ready_trial(trial_spec(benchmark), datasets_dir, workdir)
    model = copy.deepcopy(trial.model)
    optimizer = type(trial.optimizer)(model.parameters(), **trial.optimizer.defaults)
    loader = bare_loader(trial)
    epochs = iter(range(1, 10**6))
    seconds = interleaved(
        {
            "trial": lambda: trial.train_epoch(next(epochs)),
            "bare": lambda: bare_epoch(
                model, optimizer, trial.criterion, loader, trial.device, trial.model_spec.forward_takes_targets
            ),
        },
        rounds=rounds,
    )
    samples = trial.steps_per_epoch * trial.global_batch
    code_ms, step_ms = harness_code_ms_per_step(trial, epochs)
    trial.close()
    result = {"benchmark": benchmark, "samples_per_epoch": samples, "seconds": seconds}
    result |= {"harness_code_ms": code_ms, "step_ms": step_ms}
    for clock in ("wall", "cpu"):
        bare, harness = seconds["bare"][clock], seconds["trial"][clock]
        # Medians: one epoch stalled by another process's burst must not decide the figure.
        result[clock] = {
            "trial_samples_per_s": samples / statistics.median(harness),
            "bare_samples_per_s": samples / statistics.median(bare),
            "round_ratios": sorted(b / h for b, h in zip(bare, harness, strict=True)),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--benchmarks", nargs="+", default=["resnet50-synthetic"], choices=sorted(SMALL_SPLITS))
    parser.add_argument("--rounds", type=int, default=20, help="timed epochs of each, after one warm-up epoch each")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads; {CONTENTION_NOTE}")
    print(f"warm-up: 1 epoch of each excluded; {args.rounds} timed epochs of each, interleaved")
    with tempfile.TemporaryDirectory(prefix="bench-harness-") as tmp:
        for benchmark in args.benchmarks:
            result = measure(benchmark, args.rounds, Path(tmp) / "datasets", Path(tmp))
            print(f"{benchmark}: {result['samples_per_epoch']} samples per epoch; wall s per epoch, in order:")
            for name in ("trial", "bare"):
                print(f"  {name:5s} " + " ".join(f"{value:.2f}" for value in result["seconds"][name]["wall"]))
            print(
                f"  harness's own Python per step (cProfile, upper bound): {result['harness_code_ms']:.3f} ms of "
                f"{result['step_ms']:.1f} ms ({result['harness_code_ms'] / result['step_ms']:.2%})"
            )
            for clock, label in (("wall", "wall time"), ("cpu", "CPU time of this process")):
                figures = result[clock]
                ratios = figures["round_ratios"]
                quartiles = statistics.quantiles(ratios, n=4)
                print(
                    f"  {label}, median epoch: trial {figures['trial_samples_per_s']:.2f} samples/s, bare loop "
                    f"{figures['bare_samples_per_s']:.2f} samples/s; ratio trial/bare: median of rounds "
                    f"{statistics.median(ratios):.3f} (quartiles {quartiles[0]:.3f}..{quartiles[2]:.3f}); "
                    f"goal >= {GOAL}"
                )


if __name__ == "__main__":
    main()
