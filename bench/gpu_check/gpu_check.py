"""GPU validation of the trial code: full-size ResNet-50, CosmoFlow and DeepCAM through the project's own
trial (mlcampaign.trial.protocol.run_trial, mlcampaign.trial.torch.trial.TorchTrial) on one GPU, in bf16 and
fp32.

    bash bench/gpu_check/run.sh --wheels .whl OUTDIR           # on the device machine (one NVIDIA H200)
    bash bench/gpu_check/run.sh OUTDIR --dry-run               # anywhere: the CPU dry mode, tiny sizes
    python bench/gpu_check/gpu_check.py --list                 # the parts (each skippable with --skip)

Parts, in order (names for --skip / --only, shell patterns such as 'deepcam:*' or '*:fp32:*'):

- ``env``: versions (torch, CUDA, cuDNN, NCCL, driver: mlcampaign.measure.software_stack), the device, its
  TF32 settings, whether the benchmark schema has a ``compile`` option, torch_device's refusal of a missing GPU.
- ``roofline``: the trial's own matmul peak (mlcampaign.trial.protocol.measure_process_roof: 8192² on a GPU) in
  fp32, bf16 and fp16: the roof of every MFU below.
- ``<benchmark>:<precision>:trial``: one short real trial (run_trial: staging check, the trial's roofline,
  one epoch with the declared warm-up step(s), one evaluation, the record, validated): loader-inclusive
  throughput, the trial's data / compute split, MFU against the measured and the nominal peak.
- ``<benchmark>:<precision>:compute``: a prepared trial (``prepare()``): one timed pass of its own data
  loader (its rate), then its own ``train_epoch`` on batches already on the device (compute-only rate)
  alternating with a bare PyTorch loop (bench/harness_overhead.bare_epoch, same batches, model copy,
  autocast) for the harness ratio; energy per sample through NVML (mlcampaign.measure.energy.monitor.EnergyMonitor),
  device memory high-water mark (torch.cuda.max_memory_allocated).
- variants, compute-only: ``:channels_last`` (channels_last / channels_last_3d), ``resnet50:bf16:cudnn_benchmark``
  (torch.backends.cudnn.benchmark, which the trial does not set), ``resnet50:fp16:scaler`` (fp16 autocast
  with the enabled GradScaler).
- ``nccl:<compression>``: one process that still forms a process group (NCCL on the GPU, gloo in dry mode)
  so that DistributedDataParallel, the AllreduceTimer-wrapped DDP hook, the collectives of evaluation
  and the per-rank gather run: world size 1; more ranks need a GPU each (a declared gap).
- ``deepcam:fp32:oom``: run_trial with the whole training split as one batch, to see an out-of-memory
  failure become a failure record (GPU sizes; in dry mode the same code at a size that fits).

Sizes: on the GPU the benchmark files' full-size models (ResNet-50 224² from config/benchmarks/resnet50.yaml,
batch 256; CosmoFlow 128³ x 4, batch 8; DeepCAM 768 x 1152 x 16, batch 4), generated data in their real
formats (mlcampaign.plan.registry.generators() through mlcampaign.data.staging.stage, in parallel processes, on
the machine's local disk under --scratch); in dry mode the default campaign's CPU-sized variants, a
couple of batches, on the CPU. Warm-up: ``warmup_steps`` of the trial (1) in trials, one epoch of each
loop before timed compute-only rounds; both declared in the output.

Output under OUTDIR (which must be empty or absent): ``summary.csv`` (one row per benchmark, precision and
variant, units in the column names), ``gpu_paths.csv`` (every GPU-only code path of the trial, whether
this run executed it and the evidence), ``results.json`` (every part's full results and records) and
``log.txt`` (this output). They are rewritten after every part, so a run stopped at its time limit keeps
what it measured. Parts that would start after ``--budget-s`` are skipped and listed. Exit status 0 when
every part ran, 1 when one failed, 2 for bad arguments or missing packages.

Run it with the interpreter of the machine (it needs no pins of this project): the packages it needs
and that the device image lacks are in bench/gpu_check/wheels.txt (fetch_wheels.sh downloads them,
run.sh --wheels installs them); a missing one stops the check here, named.

On the lent H200 (/work/.library/device/README.md): here, once, ``echo /.whl/ >> .git/info/exclude`` and
``bash bench/gpu_check/fetch_wheels.sh``; then one device call with carry [".whl"] and timeout_s 540:
``bash bench/gpu_check/run.sh --wheels .whl "$OUT"`` (the four output files land in $OUT). The parts fit
the default --budget-s 420 with room to spare; later parts are skipped, not cut, if they do not.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Every module the trial code and this check import (top level) -> the distribution that provides it.
REQUIRED_MODULES = {
    "torch": "torch",
    "torchvision": "torchvision",
    "numpy": "numpy",
    "pandas": "pandas",
    "h5py": "h5py",
    "PIL": "pillow",
    "yaml": "pyyaml",
    "attrs": "attrs",
    "jsonschema": "jsonschema",
    "jsonschema_specifications": "jsonschema-specifications",
    "referencing": "referencing",
    "rpds": "rpds-py",
    "mlperf_logging": "mlperf-logging",
    "google_crc32c": "google-crc32c",
}
# Optional: without it the check measures no GPU energy and says so.
OPTIONAL_MODULES = {"pynvml": "nvidia-ml-py"}
WHEELS_HINT = (
    "the device image lacks some of them: fetch their wheels with bash bench/gpu_check/fetch_wheels.sh "
    "(bench/gpu_check/wheels.txt), carry .whl and run bash bench/gpu_check/run.sh --wheels .whl OUTDIR"
)


def missing_packages(modules: dict[str, str]) -> list[str]:
    """'distribution (module name)' for every module of ``modules`` that this interpreter cannot import."""
    return [f"{dist} (module {module})" for module, dist in modules.items() if importlib.util.find_spec(module) is None]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="output folder (must be empty or absent)")
    parser.add_argument("--dry-run", action="store_true", help="CPU dry mode: tiny sizes, a couple of steps")
    parser.add_argument("--skip", nargs="+", default=[], metavar="PATTERN", help="parts to skip (shell patterns)")
    parser.add_argument(
        "--only", nargs="+", default=[], metavar="PATTERN", help="run only these parts (shell patterns)"
    )
    parser.add_argument("--list", action="store_true", help="print the parts and exit")
    parser.add_argument("--scratch", type=Path, help="datasets and trial files (default: a new folder in /tmp)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="skip parts that would start after this")
    parser.add_argument("--steps", type=int, help="compute-only steps per epoch (default: per benchmark)")
    parser.add_argument(
        "--rounds", type=int, help="timed compute-only epochs of each loop, after 1 warm-up (default: 3; dry mode 1)"
    )
    parser.add_argument(
        "--data-workers", type=int, help="data loader workers (default: 8 on the GPU, the benchmark's own in dry mode)"
    )
    args = parser.parse_args(argv)
    if args.rounds is None:
        args.rounds = 1 if args.dry_run else 3
    if not args.list and args.out is None:
        parser.error("--out is required (or --list)")
    for name in ("steps", "rounds", "data_workers"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "data_workers" else 1):
            parser.error(f"--{name.replace('_', '-')} {value}: must be at least {0 if name == 'data_workers' else 1}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    missing = missing_packages(REQUIRED_MODULES)
    if missing:
        print(
            f"bench/gpu_check: {sys.executable} cannot import: {', '.join(missing)}; {WHEELS_HINT}",
            file=sys.stderr,
        )
        return 2
    if not args.list and args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        print(f"bench/gpu_check: --out {args.out} is not an empty folder: give a new one", file=sys.stderr)
        return 2
    sys.path[:0] = [str(HERE), str(HERE.parent)]  # check_parts; bench/: _common and harness_overhead
    try:
        import check_parts
    except ImportError as error:  # e.g. a carried wheel of another version than its dependants need
        print(f"bench/gpu_check: importing the trial code failed: {error}; {WHEELS_HINT}", file=sys.stderr)
        return 2
    try:
        return check_parts.run(args, missing_optional=missing_packages(OPTIONAL_MODULES))
    except check_parts.UsageError as error:
        print(f"bench/gpu_check: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
