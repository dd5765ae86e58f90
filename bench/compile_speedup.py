"""Compiled training steps: the trial with ``training.compile`` (torch.compile) vs the eager bare loop.

    .venv/bin/python bench/compile_speedup.py [--benchmarks resnet50-synthetic cosmoflow deepcam extreme-weather]
                                              [--rounds 8] [--mode default] [--deepcam-width 1.0]

Per CPU-sized benchmark of the default campaign (bench/_common.py's small splits), four ways to train
the same model from the same initial weights, with the same optimizer, loss, batch and reader:

- ``eager bare loop``: a shuffling DataLoader, zero_grad, forward, loss, backward, optimizer step, on a
  copy of the eager trial's model (harness_overhead.py's loop): the reference, ratio 1;
- ``channels_last bare loop``: the same with the model and each batch in channels-last memory format
  (torch.channels_last for 2-D convolutions, channels_last_3d for 3-D): the eager option alone;
- ``compiled trial``: TorchTrial's own training epoch with ``training.compile: {enabled: true, mode}``
  (inductor), compiled in its set-up (MLPerf init) on synthetic inputs;
- ``compiled + channels_last trial``: the same with ``training.channels_last: true``.

Epochs of the four alternate (ABCD DCBA ...), the first of each is warm-up and not counted; printed:
samples/s of the median epoch and the ratio to the eager bare loop, from wall time and from this
process's CPU time (all threads; less moved by other work on a shared machine). Goal >= 1.1 where
compiling helps; a ratio below 1 is printed as measured.

Compile time is printed apart, as the record has it (``metrics.compile_s``), from trials set up in
new processes: cold, with an empty inductor cache directory, and warm, by a second process with the
same directory (what every later trial on the node pays: dynamo tracing again, compiled kernels from
the cache). The timed compiled trials then compile in this process from that warm cache. A detector
(extreme weather) is refused by the trial and printed as such.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from _common import CONTENTION_NOTE, SMALL_SPLITS, bare_loader, interleaved, ready_trial, trial_spec
from harness_overhead import bare_epoch
from torch.utils.data import DataLoader

GOAL = 1.1
CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}  # by the rank of a batch


def overrides(mode: str | None, channels_last: bool, deepcam_width: float | None, benchmark: str) -> dict:
    training = {"channels_last": channels_last}
    if mode is not None:
        training["compile"] = {"enabled": True, "mode": mode}
    result = {"training": training}
    if benchmark == "deepcam" and deepcam_width is not None:
        result["model"] = {"options": {"width": deepcam_width}}
    return result


def channels_last_loader(loader: DataLoader):
    """The batches of ``loader`` with their inputs in channels-last memory format."""
    for inputs, targets in loader:
        yield inputs.contiguous(memory_format=CHANNELS_LAST[inputs.dim()]), targets


def compile_time_in_new_process(args: argparse.Namespace, benchmark: str, channels_last: bool, cache: Path) -> float:
    """compile_s of a trial set up in a new process with the inductor cache directory ``cache``; None where
    the trial refuses to compile the model (its reason is printed)."""
    command = [sys.executable, __file__, "--compile-time-only", benchmark, "--mode", args.mode]
    command += ["--datasets", str(args.datasets), "--cache", str(cache)]
    command += ["--channels-last"] if channels_last else []
    command += ["--deepcam-width", str(args.deepcam_width)] if args.deepcam_width is not None else []
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.splitlines()[-1])


def compiled_trial(args: argparse.Namespace, benchmark: str, channels_last: bool, cache: Path, workdir: Path):
    """A TorchTrial of ``benchmark`` compiled in its set-up with the inductor cache directory ``cache``."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)  # read when inductor compiles
    spec = trial_spec(benchmark, overrides(args.mode, channels_last, args.deepcam_width, benchmark))
    return ready_trial(spec, args.datasets, workdir)


def measure(args: argparse.Namespace, benchmark: str, workdir: Path) -> dict:
    eager = ready_trial(
        trial_spec(benchmark, overrides(None, False, args.deepcam_width, benchmark)), args.datasets, workdir
    )  # stages the dataset for the processes below, too
    # Cold: a new process with an empty cache directory; warm: another one with the same directory.
    caches = {cl: workdir / f"inductor-{cl}" for cl in (False, True)}
    cold = {cl: compile_time_in_new_process(args, benchmark, cl, caches[cl]) for cl in (False, True)}
    if "refused" in cold[False]:
        eager.close()
        return {"benchmark": benchmark, "refused": cold[False]["refused"]}
    warm = {cl: compile_time_in_new_process(args, benchmark, cl, caches[cl]) for cl in (False, True)}
    compiled = {cl: compiled_trial(args, benchmark, cl, caches[cl], workdir / f"trial-{cl}") for cl in (False, True)}
    loader = bare_loader(eager)
    batch_rank = next(iter(loader))[0].dim()
    models = {
        "contiguous": copy.deepcopy(eager.model),
        "channels_last": copy.deepcopy(eager.model).to(memory_format=CHANNELS_LAST[batch_rank]),
    }
    optimizers = {
        name: type(eager.optimizer)(model.parameters(), **eager.optimizer.defaults) for name, model in models.items()
    }
    takes_targets = eager.model_spec.forward_takes_targets
    epochs = iter(range(1, 10**6))
    measures = {
        "eager bare loop": lambda: bare_epoch(
            models["contiguous"], optimizers["contiguous"], eager.criterion, loader, eager.device, takes_targets
        ),
        "channels_last bare loop": lambda: bare_epoch(
            models["channels_last"],
            optimizers["channels_last"],
            eager.criterion,
            channels_last_loader(loader),
            eager.device,
            takes_targets,
        ),
        "compiled trial": lambda: compiled[False].train_epoch(next(epochs)),
        "compiled + channels_last trial": lambda: compiled[True].train_epoch(next(epochs)),
    }
    seconds = interleaved(measures, rounds=args.rounds)
    samples = eager.steps_per_epoch * eager.global_batch
    for trial in (eager, *compiled.values()):
        trial.close()
    cold = {cl: figures["compile_s"] for cl, figures in cold.items()}
    warm = {cl: figures["compile_s"] for cl, figures in warm.items()}
    return {"benchmark": benchmark, "samples": samples, "seconds": seconds, "cold": cold, "warm": warm}


def report(result: dict, args: argparse.Namespace) -> None:
    benchmark = result["benchmark"]
    if "refused" in result:
        print(f"{benchmark}: not compiled: the trial refuses ({result['refused']})")
        return
    samples = result["samples"]
    print(f"{benchmark}: {samples} samples per epoch; median of {args.rounds} epochs after 1 warm-up epoch of each")
    reference = {
        clock: samples / statistics.median(result["seconds"]["eager bare loop"][clock]) for clock in ("wall", "cpu")
    }
    for name, seconds in result["seconds"].items():
        rates = {clock: samples / statistics.median(seconds[clock]) for clock in ("wall", "cpu")}
        print(
            f"  {name:31s} {rates['wall']:8.2f} samples/s wall, ratio {rates['wall'] / reference['wall']:.3f}; "
            f"CPU time ratio {rates['cpu'] / reference['cpu']:.3f}"
        )
    for cl, label in ((False, "compiled"), (True, "compiled + channels_last")):
        print(
            f"  compile time ({label}, metrics.compile_s): cold {result['cold'][cl]:.1f} s (empty cache), "
            f"warm {result['warm'][cl]:.1f} s (new process, same cache)"
        )
    print(f"  goal: compiled trial / eager bare loop >= {GOAL} where compiling helps")


def compile_time_only(args: argparse.Namespace) -> None:
    """The --compile-time-only child: set a trial up and print its compile_s (or why it refuses to compile)."""
    with tempfile.TemporaryDirectory(prefix="bench-compile-child-") as tmp:
        try:
            trial = compiled_trial(args, args.compile_time_only, args.channels_last, Path(args.cache), Path(tmp))
        except NotImplementedError as error:
            print(json.dumps({"refused": str(error)}))
            return
        print(json.dumps({"compile_s": trial.counters.compile_s}))
        trial.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--benchmarks", nargs="+", default=list(SMALL_SPLITS), choices=sorted(SMALL_SPLITS))
    parser.add_argument("--rounds", type=int, default=8, help="timed epochs of each, after one warm-up epoch each")
    parser.add_argument(
        "--mode",
        default="default",
        choices=["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"],
    )
    parser.add_argument("--deepcam-width", type=float, help="DeepCAM's channel fraction (campaign: 0.125; full: 1.0)")
    parser.add_argument("--compile-time-only", metavar="BENCHMARK", help=argparse.SUPPRESS)
    parser.add_argument("--channels-last", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--datasets", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.compile_time_only:
        compile_time_only(args)
        return
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads; inductor mode {args.mode}; "
        f"{CONTENTION_NOTE}"
    )
    with tempfile.TemporaryDirectory(prefix="bench-compile-") as tmp:
        args.datasets = Path(tmp) / "datasets"
        for benchmark in args.benchmarks:
            workdir = Path(tmp) / benchmark
            workdir.mkdir()
            report(measure(args, benchmark, workdir), args)


if __name__ == "__main__":
    main()
