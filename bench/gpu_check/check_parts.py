"""The parts of bench/gpu_check (gpu_check.py says what each measures and what it writes).

Everything a part trains goes through the project's trial: ``run_trial`` for a whole short trial and
its record, ``TorchTrial.prepare`` + ``TorchTrial.train_epoch`` for the compute-only and harness
measurements (bench/_common.ready_trial), a TorchTrial whose ``_connect`` forms a one-process group
for the distributed path. What this module adds is only what a trial does not do itself: handing the
trial batches that are already on the device, the bare loop's autocast, the timed loader pass, energy
windows and memory high-water marks around the trial's own work.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import dataclasses
import fnmatch
import functools
import itertools
import multiprocessing
import platform
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import torch
import yaml
from _common import REPO, interleaved, ready_trial, staged_dataset
from harness_overhead import bare_epoch

from mlcampaign.data.manifest import read_dataset_id
from mlcampaign.measure.energy.monitor import NOT_MEASURED, EnergyMonitor
from mlcampaign.measure.energy.source import default_sources
from mlcampaign.measure.roofline import SATURATING_SIZE
from mlcampaign.measure.software_stack import software_stack
from mlcampaign.plan import registry
from mlcampaign.plan.campaign import Scale, cell_id
from mlcampaign.plan.config import deep_merge, load_campaign
from mlcampaign.plan.config_files import load_schema, load_yaml
from mlcampaign.plan.metrics import TrialCounters, trial_metrics
from mlcampaign.plan.runs import derived_run_id, utc_now
from mlcampaign.records.builder import build_record
from mlcampaign.records.files import validate_record, write_json_atomic
from mlcampaign.trial.distributed import (
    TORCH_BACKENDS,
    DistributedSetupError,
    ProcessLayout,
    detect_layout,
    free_port,
    torch_device,
)
from mlcampaign.trial.protocol import measure_process_roof, run_trial
from mlcampaign.trial.torch.collectives import TorchDistributed
from mlcampaign.trial.torch.trial import TorchTrial, autocast, map_tensors

HERE = Path(__file__).resolve().parent
SYSTEM_FILES = {"gpu": HERE / "systems" / "gpu-check-h200.yaml", "dry": REPO / "config" / "systems" / "local-cpu.yaml"}
DEFAULT_CONFIG = REPO / "config" / "config.yaml"
# Short names of the parts -> the benchmark files they train.
BENCHMARKS = {"resnet50": "resnet50-synthetic", "cosmoflow": "cosmoflow", "deepcam": "deepcam"}
PRECISIONS = ("bf16", "fp32")
ROOFLINE_PRECISIONS = {"gpu": ("fp32", "bf16", "fp16"), "dry": ("fp32", "bf16")}
# DDP's bf16_compress_hook needs a CUDA build with NCCL (DistributedDataParallel.register_comm_hook refuses it
# otherwise), so the dry mode's gloo group runs the other two hooks.
COMPRESSIONS = {"gpu": ("none", "fp16", "bf16"), "dry": ("none", "fp16")}
# Compute-only steps per epoch on the GPU: about a second or more per timed epoch on an H200 (ResNet-50 at
# batch 256 takes ~0.1 s a step in bf16), long enough for the NVML energy counter; 2 in dry mode.
GPU_STEPS = {"resnet50": 8, "cosmoflow": 8, "deepcam": 6}
DRY_STEPS = 2
GPU_DATA_WORKERS = 8  # of the machine's 16 cores; the trial process keeps threads_per_process (4)
ENERGY_PERIOD_S = 0.1
# Benchmark overrides of the variants (compute-only parts).
VARIANTS = {"channels_last": {"training": {"channels_last": True}}, "cudnn_benchmark": {}, "scaler": {}}
DECLARED = {
    "warm-up": (
        "trial parts: the benchmark's warmup_steps (set to 1 here) are excluded from throughput and the time split "
        "(the record's metrics.warmup_steps_excluded); compute-only parts: one untimed epoch of the trial loop and "
        "one of the bare loop before the timed rounds, which alternate (trial, bare, bare, trial, ...)"
    ),
    "loader rate": (
        "one pass over the trial's own train_loader (its reader, batch size, sampler and data_workers), worker "
        "start-up included, as at the start of every epoch of a trial (its workers are not persistent)"
    ),
    "compute-only": (
        "the trial's own train_epoch (timers, divergence check, scaler, schedule, bookkeeping) on batches that a "
        "loader pass produced and that were moved to the device beforehand, cycled to the part's step count"
    ),
    "harness ratio": (
        "bare loop epoch time / trial epoch time on the same device batches (1.0: no overhead; the median of the "
        "rounds' ratios); the bare loop is bench/harness_overhead.bare_epoch on a copy of the trial's model and "
        "optimizer, inside torch.autocast for bf16 (it has no autocast of its own)"
    ),
    "MFU": (
        "counted training FLOPs per sample (mlcampaign.measure.flops) x samples/s, over the trial's measured "
        "matmul peak (roofline part, mlcampaign.measure.roofline) and over the system file's nominal dense peak "
        "(NVIDIA H200 SXM datasheet), the latter only when the device is the one that file describes"
    ),
    "fp32": (
        "an fp32 trial runs cuDNN convolutions as TF32 on Ampere and newer GPUs (torch's default, "
        "torch.backends.cudnn.allow_tf32: see the env part), while its measured fp32 roof is a full-fp32 matmul "
        "(torch.backends.cuda.matmul.allow_tf32 is off): its MFU against the measured peak can exceed 1"
    ),
    "memory": (
        "torch.cuda.max_memory_allocated (this check's torch_peak_memory_bytes) over the part; for compute-only "
        "parts over the trial's warm-up epoch, which includes the batches held on the device (device_batches_gib)"
    ),
    "energy": (
        "NVML (mlcampaign.measure.energy.monitor.EnergyMonitor, NvmlSource, sampled every 0.1 s) over windows "
        "around each timed epoch (compute-only) or the whole run_trial call (trial parts: set-up, roofline and "
        "evaluation included)"
    ),
    "distributed": (
        "world size 1: one process forms the group (NCCL with device_id on the GPU, gloo on the CPU), with "
        "DistributedDataParallel, the AllreduceTimer-wrapped DDP hook and the collectives of evaluation and of "
        "the per-rank gather; the record then says 'one process: no gradient all-reduce' as communication_method "
        "although this group all-reduces. Several ranks need one GPU each (NCCL rejects two ranks on one device): "
        "not checked here"
    ),
    "torch.compile": "not checked: the benchmark schema has no compile option (env part: compile_option)",
}

# Every GPU-only code path of the trial: key, what, where. A path with a "gap" is never run by this check.
GPU_PATHS = [
    ("now_sync", "torch.cuda.synchronize before every timer read", "mlcampaign/trial/torch/trial.py TorchTrial._now"),
    ("torch_device", "the node-local GPU and torch.cuda.set_device", "mlcampaign/trial/distributed.py torch_device"),
    ("torch_device_errors", "refusal of a local rank without a GPU", "mlcampaign/trial/distributed.py torch_device"),
    ("autocast_bf16", "torch.autocast('cuda', bfloat16) in training and evaluation", "mlcampaign/trial/torch/trial.py"),
    ("grad_scaler_fp16", "fp16 autocast with torch.amp.GradScaler('cuda') enabled", "mlcampaign/trial/torch/trial.py"),
    ("channels_last", "channels_last weights and inputs on cuda", "mlcampaign/trial/torch/trial.py _memory_format"),
    (
        "channels_last_3d",
        "channels_last_3d weights and inputs on cuda",
        "mlcampaign/trial/torch/trial.py _memory_format",
    ),
    (
        "nccl_init",
        "init_process_group('nccl', device_id=...) (the call init_torch_process_group makes)",
        "mlcampaign/trial/distributed.py",
    ),
    (
        "ddp_cuda",
        "DistributedDataParallel(device_ids=[device]) and its comm hook",
        "mlcampaign/trial/torch/trial.py _setup",
    ),
    (
        "allreduce_events",
        "torch.cuda.Event marks of the DDP hook, elapsed_time",
        "mlcampaign/trial/torch/collectives.py",
    ),
    (
        "bf16_hook",
        "bf16_compress_hook (DDP accepts it with CUDA and NCCL only)",
        "mlcampaign/trial/torch/trial.py _setup",
    ),
    ("nccl_collectives", "all_reduce, broadcast, all_gather_object on NCCL", "mlcampaign/trial/torch/collectives.py"),
    (
        "roofline_cuda",
        "matmul peak at SATURATING_SIZE['cuda'], synchronise, empty_cache",
        "mlcampaign/measure/roofline.py",
    ),
    ("eval_cuda", "evaluation sums on the device (float64 totals)", "mlcampaign/trial/torch/trial.py _evaluate"),
    (
        "max_memory",
        "torch.cuda.max_memory_allocated (the record's distributed.ranks[].device_memory_peak_bytes)",
        "mlcampaign/trial/torch/trial.py _device_memory_peak_bytes",
    ),
    (
        "nvml_energy",
        "GPU energy, power, utilisation through NVML",
        "mlcampaign/measure/energy/sources/nvml.py NvmlSource",
    ),
    ("oom_record", "torch.OutOfMemoryError on cuda -> failure reason out_of_memory", "mlcampaign/trial/protocol.py"),
    ("provenance_gpu", "gpu_model from torch.cuda.get_device_name", "mlcampaign/records/provenance.py"),
    ("software_stack_cuda", "CUDA/cuDNN/NCCL versions, loaded libcudart", "mlcampaign/measure/software_stack.py"),
]
GAPS = [
    (
        "deterministic_cublas",
        "deterministic: true sets CUBLAS_WORKSPACE_CONFIG",
        "mlcampaign/plan/seeding.py seed_everything",
        "not run: no trial here is deterministic (by reading: run_trial's roofline matmuls make torch's first "
        "cuBLAS workspace before seed_everything sets the variable)",
    ),
    (
        "multi_rank_nccl",
        "NCCL with several ranks, one GPU each",
        "mlcampaign/trial/distributed.py",
        "not run: one GPU; two ranks on one device are not a valid NCCL group",
    ),
    (
        "horovod_gpu",
        "Horovod on GPUs",
        "mlcampaign/trial/torch/collectives.py",
        "not run: horovod is not in the device image",
    ),
    (
        "tensorflow_gpu",
        "Keras trial on GPUs",
        "mlcampaign/trial/keras/",
        "not run: TensorFlow is not in the device image",
    ),
    (
        "rocm",
        "RCCL and amdsmi (AMD GPUs)",
        "mlcampaign/measure/energy/sources/amdsmi.py AmdSmiSource",
        "not run: NVIDIA machine",
    ),
    (
        "detection_cuda",
        "extreme weather (Faster R-CNN, outputs gathered to host for mAP) on cuda",
        "mlcampaign/trial/torch/trial.py _evaluate_with_metric",
        "not run: the extreme-weather benchmark is not part of this check",
    ),
]


class PartFailed(RuntimeError):
    """A part ran but its result contradicts what the code path should do."""


class UsageError(ValueError):
    """A bad argument (pattern, folder); gpu_check.py reports it and exits with status 2."""


@dataclasses.dataclass
class Part:
    name: str
    benchmark: str | None  # short name of the dataset it needs
    run: Callable[[Check, str], dict]


@dataclasses.dataclass
class Check:
    args: object
    out: Path
    scratch: Path
    mode: str  # "gpu" or "dry"
    system: dict
    config_dir: Path
    overrides: dict[str, dict]
    seed: int
    run_id: str
    started: float
    deadline: float
    monitor: EnergyMonitor | None = None
    energy_unavailable: list[str] = dataclasses.field(default_factory=list)
    pool: ProcessPoolExecutor | None = None
    datasets: dict[str, Future] = dataclasses.field(default_factory=dict)
    peaks: dict = dataclasses.field(default_factory=dict)
    evidence: dict[str, list[dict]] = dataclasses.field(default_factory=dict)
    results: list[dict] = dataclasses.field(default_factory=list)
    rows: dict[tuple, dict] = dataclasses.field(default_factory=dict)
    environment: dict = dataclasses.field(default_factory=dict)

    @property
    def gpu(self) -> bool:
        return self.mode == "gpu"

    def spec(self, key: str, precision: str, extra: dict | None = None) -> dict:
        """The trial spec of benchmark ``key`` at 1x1 in ``precision`` on this check's system, loaded and
        validated by the project's own campaign loading (mlcampaign.plan.config.load_campaign)."""
        benchmark = BENCHMARKS[key]
        config = {
            "campaign": f"gpu-check-{self.mode}",
            "description": "bench/gpu_check: short trials of full-size (GPU) or CPU-sized (dry mode) benchmarks",
            "seed": self.seed,
            "trials": 1,
            "systems": [self.system["name"]],
            "benchmarks": [benchmark],
            "matrix": {"scales": ["1x1"], "precisions": [precision]},
            "benchmark_overrides": {benchmark: deep_merge(self.overrides[key], extra or {})},
            "deterministic": False,
        }
        # A detect_host system plans any precision (without a nominal peak it uses the measured roof).
        plannable = self.system.get("detect_host") or precision in self.system.get("peak_flops_per_device", {})
        planned = precision if plannable else "fp32"
        if planned != precision and self.gpu:
            raise ValueError(f"{self.system['name']} has no peak_flops_per_device.{precision}")
        config["matrix"]["precisions"] = [planned]
        campaign = load_campaign(config, self.config_dir, source=f"bench/gpu_check ({self.mode})")
        spec = campaign.trial_spec(next(campaign.trials()), self.run_id, self.system["site"])
        if planned != precision:
            # Dry mode only, on a system without an fp16 peak: the planner plans no fp16 cell there; the spec
            # of its fp32 cell with the precision changed runs the same fp16 code (autocast, enabled GradScaler).
            cell = cell_id(Scale(1, 1), precision, "none", "torch", "native")
            spec["trial"] |= {"precision": precision, "cell": cell}
        return spec

    def dataset(self, key: str) -> Path:
        """The id file of benchmark ``key``'s staged dataset (waits for its generation)."""
        if key not in self.datasets:
            raise RuntimeError(f"no dataset of '{key}' was generated (all its parts were deselected at the start)")
        id_path = self.datasets[key].result()
        if self.pool is not None and all(future.done() for future in self.datasets.values()):
            self.pool.shutdown()
            self.pool = None
        return id_path

    def saw(self, path: str, part: str, device: torch.device | str, detail: str) -> None:
        """Evidence that ``part`` ran GPU path ``path`` (on ``device``; cpu in dry mode)."""
        self.evidence.setdefault(path, []).append({"part": part, "device": str(device), "detail": detail})

    def row(self, key: str, precision: str, variant: str = "") -> dict:
        return self.rows.setdefault(
            (key, precision, variant), {"benchmark": key, "precision": precision, "variant": variant}
        )

    def nominal_peak(self, precision: str) -> float | None:
        """The system file's nominal peak, where it describes this device."""
        if self.gpu and not self.environment.get("nominal_peaks_apply"):
            return None
        return self.system.get("peak_flops_per_device", {}).get(precision)

    def measured_peak(self, precision: str) -> float | None:
        peak = self.peaks.get(precision)
        return peak.flops_per_s if peak else None


# -------------------------------------------------------------------------------- set-up


def benchmark_overrides(mode: str, data_workers: int | None) -> dict[str, dict]:
    """Per short benchmark name, its overrides for this check: sizes and small splits, one epoch, 1 warm-up step."""
    common = {"training": {"epochs_max": 1, "eval_every": 1, "warmup_steps": 1}}
    workers = GPU_DATA_WORKERS if mode == "gpu" and data_workers is None else data_workers
    if workers is not None:
        common["training"]["data_workers"] = workers
    if mode == "gpu":
        # Full-size ResNet-50 as the MLPerf benchmark file has it (1000 classes, 224², MLPerf augmentation), on
        # generated class folders (10 classes) instead of $IMAGENET_DIR; 4 steps of 256, 70 validation images.
        resnet50 = load_yaml(REPO / "config" / "benchmarks" / "resnet50.yaml")
        sizes = {
            "resnet50": {
                "model": {"options": resnet50["model"]["options"]},
                "dataset": {
                    "name": "gpu-check-images-224",
                    "reader_options": resnet50["dataset"]["reader_options"],
                    "source": {"options": {"image_size": 224, "train_per_class": 103, "val_per_class": 7}},
                },
                "training": {"global_batch_size": 256, "eval_batch_size": 64},
            },
            # The benchmark files' own full-size models; 4 training steps, one evaluation batch.
            "cosmoflow": {
                "dataset": {
                    "name": "gpu-check-cosmoflow-128",
                    "source": {"options": {"train_samples": 32, "val_samples": 8}},
                },
                "training": {"global_batch_size": 8, "eval_batch_size": 8},
            },
            "deepcam": {
                "dataset": {
                    "name": "gpu-check-deepcam-768x1152",
                    "source": {"options": {"train_samples": 16, "val_samples": 4}},
                },
                "training": {"global_batch_size": 4, "eval_batch_size": 4},
            },
        }
    else:
        # The default campaign's CPU-sized variants (config/config.yaml), with MLPerf augmentation for ResNet-50
        # as on the GPU; 2 training steps each.
        default = load_yaml(DEFAULT_CONFIG)["benchmark_overrides"]
        sizes = {
            "resnet50": {
                "dataset": {
                    "name": "gpu-check-dry-images-32",
                    "reader_options": {"augment": True},
                    "source": {"options": {"train_per_class": 1, "val_per_class": 1}},
                },
                "training": {"global_batch_size": 4, "eval_batch_size": 10},
            },
            "cosmoflow": deep_merge(
                default["cosmoflow"],
                {
                    "dataset": {
                        "name": "gpu-check-dry-cosmoflow-32",
                        "source": {"options": {"train_samples": 8, "val_samples": 2}},
                    },
                    "training": {"global_batch_size": 4, "eval_batch_size": 2},
                },
            ),
            "deepcam": deep_merge(
                default["deepcam"],
                {
                    "dataset": {
                        "name": "gpu-check-dry-deepcam-64x96",
                        "source": {"options": {"train_samples": 4, "val_samples": 2}},
                    },
                    "training": {"global_batch_size": 2, "eval_batch_size": 2},
                },
            ),
        }
    return {key: deep_merge(value, common) for key, value in sizes.items()}


def write_config_dir(mode: str, scratch: Path) -> tuple[Path, dict]:
    """A config folder for load_campaign: the project's benchmark files and this check's system file, whose
    staging_dir is set to node-local scratch (so the trials copy and verify their dataset as MLPerf staging does)
    and, in dry mode, with one intra-op thread."""
    root = scratch / "config"
    (root / "systems").mkdir(parents=True)
    (root / "benchmarks").symlink_to(REPO / "config" / "benchmarks", target_is_directory=True)
    system = load_yaml(SYSTEM_FILES[mode])
    system["staging_dir"] = str(scratch / "node-local")
    if mode == "dry":
        system["threads_per_process"] = 1  # tiny models: more threads only contend on a busy machine
    (root / "systems" / f"{system['name']}.yaml").write_text(yaml.safe_dump(system, sort_keys=False))
    return root, system


def start_generation(check: Check, keys: list[str]) -> None:
    """Generate the datasets of ``keys`` in parallel processes (forked before CUDA is initialised; they never
    use it)."""
    if not keys:
        return
    check.pool = ProcessPoolExecutor(max_workers=len(keys), mp_context=multiprocessing.get_context("fork"))
    for key in keys:
        check.datasets[key] = check.pool.submit(staged_dataset, check.spec(key, "fp32"), check.scratch / "datasets")


# -------------------------------------------------------------------------------- measurements


def reset_peak_memory() -> None:
    if torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()


def torch_peak_memory_bytes() -> dict[str, int] | str:
    """The high-water mark since the last reset (``torch.cuda.max_memory_allocated``, bytes per device) where this
    process has used CUDA, or why there is none."""
    if not torch.cuda.is_initialized():
        return f"{NOT_MEASURED}CUDA is not initialised in this process"
    return {f"cuda:{index}": int(torch.cuda.max_memory_allocated(index)) for index in range(torch.cuda.device_count())}


def _memory_evidence(check: Check, part: str, record: dict) -> None:
    """Evidence of the trial's own high-water mark: its record's per-rank device_memory_peak_bytes."""
    peaks = [rank["device_memory_peak_bytes"] for rank in record["distributed"]["ranks"]]
    if peaks and all(peak is not None for peak in peaks):
        detail = ", ".join(f"rank {rank} {peak / 2**30:.2f} GiB" for rank, peak in enumerate(peaks))
        check.saw("max_memory", part, record["system"]["device"], f"device_memory_peak_bytes: {detail}")


def gib(memory: dict[str, int] | str) -> float | None:
    return memory.get("cuda:0", 0) / 2**30 if isinstance(memory, dict) else None


def gpu_energy(check: Check, part: str, windows: list[dict], samples: int | None) -> dict:
    """The NVML source's energy over ``windows`` together (J, W, J per sample), or why it was not measured."""
    entries = [next((s for s in window["sources"] if s["source"] == "nvml"), None) for window in windows]
    if not windows or any(entry is None for entry in entries):
        why = next((w["not_measured"] for w in windows if w["not_measured"]), None)
        nvml = [reason for reason in check.energy_unavailable if reason.startswith("NVML")]
        return {"not_measured": why or ("not measured: " + "; ".join(nvml or ["no NVML source was opened"]))}
    missing = [entry["not_measured"] for entry in entries if entry["not_measured"]]
    if missing:
        return {"not_measured": missing[0]}
    energy = sum(entry["energy_j"] for entry in entries)
    duration = sum(window["duration_s"] for window in windows)
    devices = [device for entry in entries for device in entry["devices"].values()]
    utilisation = [d["utilization_pct_mean"] for d in devices if d["utilization_pct_mean"] is not None]
    peaks = [entry["peak_power_w"] for entry in entries if entry["peak_power_w"] is not None]
    check.saw("nvml_energy", part, "cuda", f"{energy:.0f} J over {duration:.1f} s in {len(windows)} window(s)")
    return {
        "energy_j": energy,
        "duration_s": duration,
        "mean_power_w": energy / duration,
        "peak_power_w": max(peaks) if peaks else None,
        "j_per_sample": energy / samples if samples else None,
        "utilization_pct_mean": statistics.mean(utilisation) if utilisation else None,
        "windows": len(windows),
        "source": entries[0]["description"],
    }


def windowed(monitor: EnergyMonitor, label: str, measure: Callable[[], object], windows: list[dict]):
    """``measure`` inside an energy window of its own at every call (results appended to ``windows``)."""
    calls = itertools.count()

    def run() -> None:
        name = f"{label}/{next(calls)}"
        monitor.begin(name)
        try:
            measure()
        finally:
            windows.append(monitor.end(name))

    return run


def autocast_for(device: torch.device, precision: str):
    """What the trial's autocast is (mlcampaign.trial.torch.trial.autocast), for the bare loop that has none."""
    return autocast(device, precision)


@contextlib.contextmanager
def cudnn_benchmark(enabled: bool):
    previous = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = enabled or previous
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = previous


def tensor_bytes(value) -> int:
    total = 0

    def add(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    map_tensors(add, value)
    return total


def fraction(achieved: float | None, peak: float | None) -> float | None:
    return achieved / peak if achieved and peak else None


def tera(value: float | None) -> float | None:
    return value / 1e12 if value else None


# -------------------------------------------------------------------------------- parts


def env_part(check: Check, name: str) -> dict:
    cuda = torch.cuda.is_available()
    cudnn_conv = getattr(torch.backends.cudnn, "conv", None)
    matmul = torch.backends.cuda.matmul
    env = {
        "mode": check.mode,
        "python": f"{platform.python_version()} ({sys.executable})",
        "torch": torch.__version__,
        "cuda_available": cuda,
        "system_file": str(SYSTEM_FILES[check.mode].relative_to(REPO)),
        "tf32": {
            "torch.backends.cudnn.allow_tf32 (convolutions)": torch.backends.cudnn.allow_tf32,
            "torch.backends.cuda.matmul.allow_tf32": matmul.allow_tf32,
            "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision(),
            "torch.backends.cudnn.conv.fp32_precision": getattr(cudnn_conv, "fp32_precision", "absent"),
            "torch.backends.cuda.matmul.fp32_precision": getattr(matmul, "fp32_precision", "absent"),
        },
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "software_stack": software_stack(),
    }
    training = load_schema("benchmark")["properties"]["training"]["properties"]
    env["compile_option"] = (
        "training.compile exists in the benchmark schema: this check does not cover it yet"
        if "compile" in training
        else "skipped: the benchmark schema (mlcampaign/plan/schemas/benchmark.schema.yaml) has no training.compile "
        "option"
    )
    if cuda:
        properties = torch.cuda.get_device_properties(0)
        env["device"] = {
            "name": properties.name,
            "capability": f"{properties.major}.{properties.minor}",
            "memory_gib": properties.total_memory / 2**30,
            "multiprocessors": properties.multi_processor_count,
            "count": torch.cuda.device_count(),
        }
        env["nominal_peaks_apply"] = properties.name == check.system["accelerator"]
        if not env["nominal_peaks_apply"]:
            print(
                f"warning: the device is '{properties.name}', not the '{check.system['accelerator']}' whose datasheet "
                f"peaks {env['system_file']} holds: no MFU against a nominal peak"
            )
        if env["software_stack"]["torch"]["cuda"].startswith("not available"):
            raise PartFailed(f"torch sees a GPU but reports no CUDA build: {env['software_stack']['torch']}")
        libraries = env["software_stack"]["libraries"]
        check.saw("software_stack_cuda", name, "cuda", f"torch {env['software_stack']['torch']}, libraries {libraries}")
    elif check.gpu:
        raise PartFailed("torch sees no CUDA device: run with --dry-run for the CPU check")
    # torch_device must refuse a local rank that has no GPU (here: one past the last).
    beyond = ProcessLayout(0, 1, torch.cuda.device_count() if cuda else 0, 1, "127.0.0.1", 0, "bench/gpu_check")
    try:
        torch_device("cuda", beyond)
    except DistributedSetupError as error:
        env["torch_device_refusal"] = str(error)
        check.saw("torch_device_errors", name, "cuda" if cuda else "cpu", str(error))
    else:
        raise PartFailed(
            f"torch_device accepted local rank {beyond.local_rank} with {torch.cuda.device_count()} GPU(s)"
        )
    check.environment = env
    stack = env["software_stack"]
    print(f"python {env['python']}; torch {torch.__version__}; {stack['torch']}; driver {stack['gpu_driver']}")
    if cuda:
        device = env["device"]
        print(
            f"device {device['name']} (sm {device['capability']}, {device['memory_gib']:.0f} GiB, "
            f"{device['multiprocessors']} SMs)"
        )
    print(f"TF32: {env['tf32']}")
    print(f"torch.compile: {env['compile_option']}")
    return {"environment": env}


def roofline_part(check: Check, name: str) -> dict:
    layout = detect_layout()
    peaks = {}
    for precision in ROOFLINE_PRECISIONS[check.mode]:
        # The roof of a 1x1 trial in ``precision`` on this system: all it reads of a spec is set here.
        spec = {"system": check.system, "trial": {"tasks_per_node": 1, "precision": precision}}
        peak = measure_process_roof(spec, layout)
        check.peaks[precision] = peak
        peaks[precision] = dataclasses.asdict(peak) | {"measured_with": peak.describe()}
        print(f"  {precision}: {peak.flops_per_s / 1e12:.2f} TFLOP/s ({peak.describe()})")
        nominal = check.nominal_peak(precision)
        if nominal:
            print(
                f"    nominal {nominal / 1e12:.1f} TFLOP/s ({check.system['peak_source']}): "
                f"measured/nominal {peak.flops_per_s / nominal:.2f}"
            )
        if peak.size == SATURATING_SIZE[torch.device(peak.device).type]:
            check.saw(
                "roofline_cuda", name, peak.device, f"{precision} {peak.size}^2: {peak.flops_per_s / 1e12:.1f} TFLOP/s"
            )
    return {"peaks": peaks}


def _trial(check: Check, name: str, spec: dict, key: str) -> dict:
    """run_trial of ``spec`` with an energy window and the memory high-water mark around it."""
    id_path = check.dataset(key)
    folder = check.scratch / "trials" / name.replace(":", "-")
    reset_peak_memory()
    check.monitor.begin(name)
    try:
        record = run_trial(spec, id_path, folder / "record.json", folder / "mllog.txt")
    finally:
        energy = check.monitor.end(name)
    return {
        "record": record,
        "energy": gpu_energy(check, name, [energy], None),
        "peak_memory_bytes": torch_peak_memory_bytes(),
    }


def _trial_row(check: Check, row: dict, result: dict) -> None:
    record = result["record"]
    metrics, flops, roofline = record["metrics"], record["flops"], record["roofline"]
    step_s = sum(metrics[key] or 0.0 for key in ("data_loading_s", "compute_s", "communication_s"))
    steps = metrics["samples_trained"] // record["benchmark"]["global_batch_size"] if metrics["samples_trained"] else 0
    row.update(
        global_batch=record["benchmark"]["global_batch_size"],
        channels_last=record["benchmark"]["channels_last"],
        trial_status=record["status"] if record["status"] == "ok" else f"failed: {record['failure']['reason']}",
        trial_samples_per_s=metrics["throughput_samples_per_s"],
        trial_measured_steps=steps - (metrics["warmup_steps_excluded"] or 0),
        trial_data_loading_s=metrics["data_loading_s"],
        trial_compute_s=metrics["compute_s"],
        trial_communication_s=metrics["communication_s"],
        trial_allreduce_in_flight_s=metrics["allreduce_in_flight_s"],
        trial_data_share=metrics["data_loading_s"] / step_s if step_s else None,
        train_gflop_per_sample=flops["train_per_sample"] / 1e9 if flops["train_per_sample"] else None,
        trial_mfu_measured_peak=roofline["achieved_fraction"],
        trial_fraction_nominal_peak=flops["fraction_of_peak"]
        if check.nominal_peak(record["trial"]["precision"])
        else None,
        trial_peak_memory_gib=gib(result["peak_memory_bytes"]),
    )


def _trial_evidence(check: Check, name: str, record: dict) -> None:
    device, metrics = record["system"]["device"], record["metrics"]
    if record["status"] != "ok":
        return
    check.saw("now_sync", name, device, f"{metrics['samples_trained']} samples trained with the trial's timers")
    if device == "cuda":
        check.saw("torch_device", name, device, "run_trial's TorchTrial on the GPU")
    quality = f"{metrics['samples_evaluated']} samples evaluated: {metrics['achieved_quality']}"
    check.saw("eval_cuda", name, device, quality)
    check.saw("roofline_cuda", name, device, f"run_trial measured {record['roofline']['measured_with']}")
    if record["provenance"]["gpu_model"]:
        check.saw("provenance_gpu", name, device, record["provenance"]["gpu_model"])
    _memory_evidence(check, name, record)
    if record["trial"]["precision"] == "bf16":
        check.saw("autocast_bf16", name, device, "training and evaluation under autocast bf16")


def trial_part(check: Check, name: str, key: str, precision: str) -> dict:
    result = _trial(check, name, check.spec(key, precision), key)
    record = result["record"]
    _trial_row(check, check.row(key, precision), result)
    _trial_evidence(check, name, record)
    metrics = record["metrics"]
    if record["status"] != "ok":
        result["status"] = (
            f"failed: the trial's record says {record['failure']['reason']}: {record['failure']['message']}"
        )
    else:
        print(
            f"  {metrics['throughput_samples_per_s']:.1f} samples/s (loader included); "
            f"data {metrics['data_loading_s']:.2f} s, compute {metrics['compute_s']:.2f} s; "
            f"fraction of the measured roof {record['roofline']['achieved_fraction']}"
        )
    return result


def _loader_pass(trial: TorchTrial) -> tuple[float, list]:
    """One timed pass over the trial's own training loader; the batches it produced (on the host)."""
    trial.sampler.set_epoch(0)
    start = time.perf_counter()
    batches = list(trial.train_loader)
    return time.perf_counter() - start, batches


def compute_part(check: Check, name: str, key: str, precision: str, variant: str = "", bare: bool = True) -> dict:
    spec = check.spec(key, precision, VARIANTS.get(variant))
    check.dataset(key)  # generated in the background: wait for it
    with cudnn_benchmark(variant == "cudnn_benchmark"):
        trial = ready_trial(spec, check.scratch / "datasets", check.scratch / "work")
        try:
            return _compute(check, name, key, precision, variant, trial, bare)
        finally:
            trial.close()


def _compute(check: Check, name: str, key: str, precision: str, variant: str, trial: TorchTrial, bare: bool) -> dict:
    device = trial.device
    loader_s, host_batches = _loader_pass(trial)
    loaded_samples = sum(len(inputs) for inputs, _ in host_batches)
    batches = [(inputs.to(device), map_tensors(lambda t: t.to(device), targets)) for inputs, targets in host_batches]
    del host_batches
    steps = check.args.steps or (GPU_STEPS[key] if check.gpu else DRY_STEPS)
    trial.train_loader = [batches[step % len(batches)] for step in range(steps)]  # compute-only: already on the device
    samples_per_epoch = steps * trial.global_batch
    epochs = itertools.count(1)
    scale_before = trial.scaler.get_scale() if trial.scaler.is_enabled() else None

    reset_peak_memory()
    trial.train_epoch(next(epochs))  # warm-up (declared)
    memory = torch_peak_memory_bytes()
    measures = {"trial": lambda: trial.train_epoch(next(epochs))}
    if bare:
        model = copy.deepcopy(trial.model)
        optimizer = type(trial.optimizer)(model.parameters(), **trial.optimizer.defaults)

        def bare_loop() -> None:
            with autocast_for(device, precision):
                bare_epoch(
                    model,
                    optimizer,
                    trial.criterion,
                    trial.train_loader,
                    device,
                    trial.model_spec.forward_takes_targets,
                )

        bare_loop()  # warm-up (declared)
        measures["bare"] = bare_loop
    # The trial's own timers over the timed rounds only.
    trial.counters = TrialCounters(warmup_steps=0, communication_method=trial.counters.communication_method)
    windows = {loop: [] for loop in measures}
    seconds = interleaved(
        {loop: windowed(check.monitor, f"{name}/{loop}", measure, windows[loop]) for loop, measure in measures.items()},
        rounds=check.args.rounds,
        warmup=0,
    )
    metrics = trial_metrics(trial.counters)
    compute_rate = metrics["throughput_samples_per_s"]
    loader_rate = loaded_samples / loader_s
    achieved = trial.flop_count.train_per_sample * compute_rate
    result = {
        "global_batch": trial.global_batch,
        "data_workers": trial.training["data_workers"],
        "memory_format": str(trial.memory_format),
        "loader": {"samples": loaded_samples, "seconds": loader_s, "samples_per_s": loader_rate},
        "compute_only": {
            "steps_per_epoch": steps,
            "timed_rounds": check.args.rounds,
            "wall_s": seconds["trial"]["wall"],
            "samples_per_s_wall": samples_per_epoch / statistics.median(seconds["trial"]["wall"]),
            "trial_metrics": metrics,
            "achieved_flops_per_s": achieved,
            "device_batches_bytes": tensor_bytes(batches),
        },
        "peak_memory_bytes": memory,
        "energy": {"trial": gpu_energy(check, name, windows["trial"], samples_per_epoch * len(windows["trial"]))},
    }
    row = check.row(key, precision, variant)
    step_s = metrics["data_loading_s"] + metrics["compute_s"] + metrics["communication_s"]
    row.update(
        global_batch=trial.global_batch,
        channels_last=trial.training["channels_last"],
        data_workers=trial.training["data_workers"],
        compute_status="ok",
        loader_samples_per_s=loader_rate,
        compute_only_samples_per_s=compute_rate,
        compute_only_data_share=metrics["data_loading_s"] / step_s,
        bound_by="data loader" if loader_rate < compute_rate else "compute",
        train_gflop_per_sample=trial.flop_count.train_per_sample / 1e9,
        compute_only_tflop_per_s=achieved / 1e12,
        measured_peak_tflop_per_s=tera(check.measured_peak(precision)),
        compute_only_mfu_measured_peak=fraction(achieved, check.measured_peak(precision)),
        nominal_peak_tflop_per_s=tera(check.nominal_peak(precision)),
        compute_only_mfu_nominal_peak=fraction(achieved, check.nominal_peak(precision)),
        peak_memory_gib=gib(memory),
        device_batches_gib=tensor_bytes(batches) / 2**30,
        gpu_j_per_sample=result["energy"]["trial"].get("j_per_sample"),
        gpu_mean_power_w=result["energy"]["trial"].get("mean_power_w"),
        gpu_peak_power_w=result["energy"]["trial"].get("peak_power_w"),
        gpu_utilization_pct_mean=result["energy"]["trial"].get("utilization_pct_mean"),
    )
    if bare:
        ratios = sorted(b / t for b, t in zip(seconds["bare"]["wall"], seconds["trial"]["wall"], strict=True))
        bare_rate = samples_per_epoch / statistics.median(seconds["bare"]["wall"])
        result["bare"] = {"wall_s": seconds["bare"]["wall"], "samples_per_s": bare_rate}
        result["harness_ratio"] = {"median": statistics.median(ratios), "rounds": ratios}
        result["energy"]["bare"] = gpu_energy(check, name, windows["bare"], samples_per_epoch * len(windows["bare"]))
        row.update(bare_samples_per_s=bare_rate, harness_ratio=statistics.median(ratios))
    if scale_before is not None:
        result["grad_scaler"] = {"scale_before": scale_before, "scale_after": trial.scaler.get_scale()}
    _compute_evidence(check, name, precision, variant, trial, result)
    ratio = f", harness ratio {result['harness_ratio']['median']:.3f}" if bare else ""
    print(
        f"  loader {loader_rate:.1f} samples/s ({trial.training['data_workers']} workers); compute-only "
        f"{compute_rate:.1f} samples/s{ratio}; {achieved / 1e12:.2f} TFLOP/s; peak memory {gib(memory) or 0:.2f} GiB"
    )
    return result


def _compute_evidence(check: Check, name: str, precision: str, variant: str, trial: TorchTrial, result: dict) -> None:
    device = trial.device
    on = str(device)
    check.saw("now_sync", name, on, f"{trial.counters.steps} steps timed by the trial's own timers")
    if device.type == "cuda":
        current = torch.cuda.current_device()
        if current != device.index:
            raise PartFailed(f"torch_device chose {device} but the current CUDA device is {current}")
        check.saw("torch_device", name, on, f"torch.cuda.current_device() = {current}")
    if registry.PRECISIONS[precision].autocast:
        context = trial.autocast
        if not (isinstance(context, torch.autocast) and context.device == device.type):
            raise PartFailed(f"a {precision} trial on {device} has autocast {context!r}")
        if precision == "bf16":
            check.saw("autocast_bf16", name, on, f"autocast {context.device} {context.fast_dtype}")
    if precision == "fp16":
        if not trial.scaler.is_enabled():
            raise PartFailed("an fp16 trial's GradScaler is disabled")
        scaler = result["grad_scaler"]
        check.saw("grad_scaler_fp16", name, on, f"loss scale {scaler['scale_before']:g} -> {scaler['scale_after']:g}")
    if variant == "channels_last":
        weight = next(p for p in trial.model.parameters() if p.dim() in (4, 5))
        if not weight.is_contiguous(memory_format=trial.memory_format):
            raise PartFailed(f"the model's first {weight.dim()}-D weight is not in {trial.memory_format}")
        path = "channels_last" if weight.dim() == 4 else "channels_last_3d"
        check.saw(path, name, on, f"{trial.memory_format}: weights and inputs, {trial.counters.steps} timed steps")


class ProcessGroupOfOne(TorchTrial):
    """A one-process TorchTrial that still forms a torch process group, so that its DistributedDataParallel
    path runs (init_torch_process_group forms none for one process; this makes the call it would make)."""

    def _connect(self) -> None:
        backend = TORCH_BACKENDS[self.system["device"]]
        device_id = self.device if self.device.type == "cuda" else None
        torch.distributed.init_process_group(
            backend,
            init_method=f"tcp://{self.layout.master_addr}:{self.layout.master_port}",
            rank=self.layout.rank,
            world_size=self.layout.world_size,
            device_id=device_id,
        )
        self.process_group = {
            "backend": torch.distributed.get_backend(),
            "world_size": torch.distributed.get_world_size(),
            "device_id": str(device_id),
        }
        self.collectives = TorchDistributed(backend)
        self.communication = self.collectives.description


def nccl_part(check: Check, name: str, compression: str) -> dict:
    key, precision = "resnet50", "bf16"
    spec = check.spec(key, precision)
    spec["trial"] |= {
        "compression": compression,
        "cell": cell_id(Scale(1, 1), precision, compression, "torch", "native"),
    }
    id_path = check.dataset(key)
    layout = dataclasses.replace(detect_layout(), master_port=free_port())
    folder = check.scratch / "trials" / name.replace(":", "-")
    started = utc_now()
    trial = ProcessGroupOfOne(spec, layout, id_path, folder / "mllog.txt")
    reset_peak_memory()
    try:
        metrics = trial.run()
        network, timer = trial.network, trial.allreduce_timer
        ddp = {
            "network": type(network).__name__,
            "device_ids": [str(device) for device in network.device_ids or []],
            "hook": timer.__name__ if timer else None,
            "cuda_events": timer.cuda if timer else None,
        }
    finally:
        trial.close()
    record = build_record(
        spec,
        read_dataset_id(id_path),
        trial.split_sizes,
        metrics,
        trial.flop_count,
        None,
        started,
        trial.distributed,
        check.peaks.get(precision),
    )
    validate_record(record)
    _memory_evidence(check, name, record)
    result = {
        "process_group": trial.process_group,
        "ddp": ddp,
        "record": record,
        "peak_memory_bytes": torch_peak_memory_bytes(),
    }
    backend, device = trial.process_group["backend"], trial.device
    problems = []
    if ddp["network"] != "DistributedDataParallel" or ddp["hook"] is None:
        problems.append(f"the trial trained a {ddp['network']} with hook {ddp['hook']}")
    if not metrics["allreduce_in_flight_s"]:
        problems.append(
            f"the AllreduceTimer timed no all-reduce (allreduce_in_flight_s {metrics['allreduce_in_flight_s']})"
        )
    if record["distributed"]["communication"] != backend or not record["distributed"]["weights_consistent"]:
        problems.append(f"the record's distributed block is {record['distributed']}")
    if problems:
        raise PartFailed("; ".join(problems))
    row = check.row(key, precision, f"ddp-{compression}")
    _trial_row(check, row, {"record": record, "peak_memory_bytes": result["peak_memory_bytes"]})
    marks = "CUDA events" if ddp["cuda_events"] else "perf_counter marks"
    check.saw("nccl_init", name, device, f"{backend}, world size 1, device_id {trial.process_group['device_id']}")
    check.saw("ddp_cuda", name, device, f"device_ids {ddp['device_ids']}, hook {ddp['hook']}")
    check.saw("allreduce_events", name, device, f"{marks}: {metrics['allreduce_in_flight_s'] * 1e3:.2f} ms in flight")
    check.saw("nccl_collectives", name, device, f"evaluation sums and buffers on {backend}, per-rank gather")
    if compression == "bf16":
        check.saw("bf16_hook", name, device, f"{ddp['hook']} registered and run")
    print(
        f"  {backend} group of 1 with {ddp['network']}({ddp['device_ids']}) and {ddp['hook']}: "
        f"{metrics['throughput_samples_per_s']:.1f} samples/s, "
        f"all-reduce in flight {metrics['allreduce_in_flight_s'] * 1e3:.2f} ms, "
        f"exposed {metrics['communication_s'] * 1e3:.2f} ms"
    )
    return result


def oom_part(check: Check, name: str) -> dict:
    key, precision = "deepcam", "fp32"
    base = check.spec(key, precision)
    batch = base["benchmark"]["dataset"]["source"]["options"]["train_samples"]
    result = _trial(check, name, check.spec(key, precision, {"training": {"global_batch_size": batch}}), key)
    record = result["record"]
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
        result["allocated_after_bytes"] = torch.cuda.memory_allocated()
    row = check.row(key, precision, "oom")
    _trial_row(check, row, result)
    if record["status"] == "ok":
        row["note"] = (
            f"no out-of-memory at batch {batch} ({gib(result['peak_memory_bytes'])} GiB): the OOM path did not run"
        )
        print(f"  {row['note']}")
    elif record["failure"]["reason"] == "out_of_memory":
        row["note"] = f"batch {batch}: out_of_memory record, as expected"
        check.saw("oom_record", name, record["system"]["device"], record["failure"]["message"][:160])
        print(f"  failure record: {record['failure']['reason']}: {record['failure']['message'][:200]}")
    else:
        result["status"] = f"failed: expected out_of_memory or ok, the record says {record['failure']}"
    return result


# -------------------------------------------------------------------------------- plan, run, outputs


def plan(mode: str) -> list[Part]:
    parts = [Part("env", None, env_part), Part("roofline", None, roofline_part)]
    for key in BENCHMARKS:
        for precision in PRECISIONS:
            parts.append(
                Part(f"{key}:{precision}:trial", key, functools.partial(trial_part, key=key, precision=precision))
            )
            parts.append(
                Part(f"{key}:{precision}:compute", key, functools.partial(compute_part, key=key, precision=precision))
            )
        parts.append(
            Part(
                f"{key}:bf16:channels_last",
                key,
                functools.partial(compute_part, key=key, precision="bf16", variant="channels_last", bare=False),
            )
        )
        if key == "resnet50":
            parts.append(
                Part(
                    "resnet50:bf16:cudnn_benchmark",
                    key,
                    functools.partial(compute_part, key=key, precision="bf16", variant="cudnn_benchmark", bare=False),
                )
            )
            parts.append(
                Part(
                    "resnet50:fp16:scaler",
                    key,
                    functools.partial(compute_part, key=key, precision="fp16", variant="scaler", bare=False),
                )
            )
            for compression in COMPRESSIONS[mode]:
                parts.append(Part(f"nccl:{compression}", key, functools.partial(nccl_part, compression=compression)))
    parts.append(Part("deepcam:fp32:oom", "deepcam", oom_part))
    return parts


def select(parts: list[Part], only: list[str], skip: list[str]) -> tuple[list[Part], dict[str, str]]:
    """The parts to run, and why each other part is skipped; an unmatched pattern is an error."""
    names = [part.name for part in parts]
    for option, patterns in (("--only", only), ("--skip", skip)):
        for pattern in patterns:
            if not fnmatch.filter(names, pattern):
                raise UsageError(f"{option} {pattern!r} matches no part (parts: {', '.join(names)})")
    skipped = {}
    for name in names:
        if only and not any(fnmatch.fnmatch(name, pattern) for pattern in only):
            skipped[name] = "skipped: not in --only"
        elif any(fnmatch.fnmatch(name, pattern) for pattern in skip):
            skipped[name] = "skipped: --skip"
    return [part for part in parts if part.name not in skipped], skipped


def run_part(check: Check, part: Part) -> None:
    elapsed = time.monotonic() - check.started
    if time.monotonic() > check.deadline:
        status = f"skipped: the time budget (--budget-s {check.args.budget_s:g}) was spent ({elapsed:.0f} s)"
        check.results.append({"part": part.name, "status": status, "elapsed_s": 0.0})
        print(f"-- {part.name}: {status}")
        return
    print(f"== {part.name} (at {elapsed:.0f} s)", flush=True)
    start = time.perf_counter()
    try:
        result = part.run(check, part.name)
        status = result.pop("status", "ok")
    except Exception as error:  # a part's failure is its result; the other parts still run
        traceback.print_exc()
        status = f"failed: {type(error).__name__}: {error}"
        result = {"traceback": traceback.format_exc()}
    finally:
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    seconds = time.perf_counter() - start
    check.results.append({"part": part.name, "status": status, "elapsed_s": seconds, **result})
    print(
        f"-- {part.name}: {status} ({seconds:.1f} s; {time.monotonic() - check.started:.0f} s since the start)",
        flush=True,
    )
    write_outputs(check)


SUMMARY_COLUMNS = [
    "benchmark",
    "precision",
    "variant",
    "global_batch",
    "channels_last",
    "data_workers",
    "trial_status",
    "trial_samples_per_s",
    "trial_measured_steps",
    "trial_data_loading_s",
    "trial_compute_s",
    "trial_communication_s",
    "trial_allreduce_in_flight_s",
    "trial_data_share",
    "trial_mfu_measured_peak",
    "trial_fraction_nominal_peak",
    "trial_peak_memory_gib",
    "compute_status",
    "loader_samples_per_s",
    "compute_only_samples_per_s",
    "compute_only_data_share",
    "bare_samples_per_s",
    "harness_ratio",
    "bound_by",
    "train_gflop_per_sample",
    "compute_only_tflop_per_s",
    "measured_peak_tflop_per_s",
    "compute_only_mfu_measured_peak",
    "nominal_peak_tflop_per_s",
    "compute_only_mfu_nominal_peak",
    "peak_memory_gib",
    "device_batches_gib",
    "gpu_j_per_sample",
    "gpu_mean_power_w",
    "gpu_peak_power_w",
    "gpu_utilization_pct_mean",
    "note",
]
PATH_COLUMNS = ["path", "what", "code", "executed_on_gpu", "evidence"]


def path_rows(check: Check) -> list[dict]:
    rows = []
    for key, what, code in GPU_PATHS:
        seen = check.evidence.get(key, [])
        on_gpu = [entry for entry in seen if entry["device"].startswith("cuda")]
        shown = on_gpu or seen
        evidence = "; ".join(f"{entry['part']} ({entry['device']}): {entry['detail']}" for entry in shown[:3])
        if on_gpu:
            executed = "yes"
        elif seen:
            executed = "no: the same code ran on the CPU (dry mode)"
        else:
            executed = "no: no part that runs it completed"
        rows.append({"path": key, "what": what, "code": code, "executed_on_gpu": executed, "evidence": evidence})
    for key, what, code, gap in GAPS:
        rows.append({"path": key, "what": what, "code": code, "executed_on_gpu": "no (declared gap)", "evidence": gap})
    return rows


def _csv(path: Path, columns: list[str], rows: list[dict]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows({column: row.get(column) for column in columns} for row in rows)
    tmp.replace(path)


def write_outputs(check: Check) -> None:
    """results.json, summary.csv and gpu_paths.csv as they stand (rewritten whole after every part)."""
    paths = path_rows(check)
    write_json_atomic(
        {
            "mode": check.mode,
            "command_line": sys.argv,
            "elapsed_s": time.monotonic() - check.started,
            "budget_s": check.args.budget_s,
            "declared": DECLARED,
            "energy_sources_unavailable": check.energy_unavailable,
            "environment": check.environment,
            "parts": check.results,
            "gpu_paths": paths,
        },
        check.out / "results.json",
    )
    _csv(check.out / "summary.csv", SUMMARY_COLUMNS, list(check.rows.values()))
    _csv(check.out / "gpu_paths.csv", PATH_COLUMNS, paths)


def _cell(value, digits: int = 1) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}" if abs(value) >= 10**-digits or value == 0 else f"{value:.2g}"
    return str(value)


def print_tables(check: Check) -> None:
    columns = [
        ("benchmark", "bench", 0),
        ("precision", "prec", 0),
        ("variant", "variant", 0),
        ("global_batch", "batch", 0),
        ("trial_samples_per_s", "trial/s", 1),
        ("trial_data_share", "data", 2),
        ("loader_samples_per_s", "loader/s", 1),
        ("compute_only_samples_per_s", "compute/s", 1),
        ("bare_samples_per_s", "bare/s", 1),
        ("harness_ratio", "ratio", 3),
        ("bound_by", "bound", 0),
        ("compute_only_tflop_per_s", "TFLOP/s", 1),
        ("compute_only_mfu_measured_peak", "MFU meas", 3),
        ("compute_only_mfu_nominal_peak", "MFU nom", 3),
        ("peak_memory_gib", "GiB", 1),
        ("gpu_j_per_sample", "J/sample", 2),
        ("gpu_mean_power_w", "W mean", 0),
        ("gpu_peak_power_w", "W peak", 0),
    ]
    table = [[header for _, header, _ in columns]]
    for row in check.rows.values():
        table.append([_cell(row.get(key), digits) for key, _, digits in columns])
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    print(
        "\nSummary (trial/s: run_trial, loader included, warm-up excluded; data: its data-loading share; loader/s: one "
        "pass of the trial's loader; compute/s and bare/s: batches already on the device; ratio = bare time / trial "
        "time; MFU of compute/s against the measured matmul peak and the nominal datasheet peak; GiB: "
        "max_memory_allocated; J/sample, W: NVML):"
    )
    for line in table:
        print("  " + "  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)))
    print("\nGPU-only code paths of the trial:")
    for row in path_rows(check):
        print(f"  {row['path']:22s} {row['executed_on_gpu']:45s} {row['evidence'][:150]}")
    print("\nParts:")
    for result in check.results:
        print(f"  {result['part']:32s} {result['elapsed_s']:7.1f} s  {result['status'][:150]}")


class _Tee:
    """Writes to a stream and to the log file."""

    def __init__(self, stream, log):
        self.stream, self.log = stream, log

    def write(self, text: str) -> int:
        self.stream.write(text)
        self.log.write(text)
        self.log.flush()
        return len(text)

    def flush(self) -> None:
        self.stream.flush()
        self.log.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


def run(args, missing_optional: list[str]) -> int:
    mode = "dry" if args.dry_run else "gpu"
    planned = plan(mode)
    parts, skipped = select(planned, args.only, args.skip)
    if args.list:
        for part in planned:
            print(part.name)
        return 0
    keep_scratch = args.scratch is not None
    if keep_scratch and args.scratch.exists() and any(args.scratch.iterdir()):
        raise UsageError(f"--scratch {args.scratch} is not an empty folder: give a new one")
    scratch = args.scratch if keep_scratch else Path(tempfile.mkdtemp(prefix="gpu-check-"))
    scratch.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    log = open(args.out / "log.txt", "w")  # noqa: SIM115 (open for the whole run, closed below)
    sys.stdout, sys.stderr = _Tee(sys.__stdout__, log), _Tee(sys.__stderr__, log)
    started = time.monotonic()
    config_dir, system = write_config_dir(mode, scratch)
    check = Check(
        args=args,
        out=args.out,
        scratch=scratch,
        mode=mode,
        system=system,
        config_dir=config_dir,
        overrides=benchmark_overrides(mode, args.data_workers),
        seed=load_yaml(DEFAULT_CONFIG)["seed"],
        run_id=derived_run_id(system["site"]),
        started=started,
        deadline=started + args.budget_s,
    )
    print(f"bench/gpu_check ({mode}): {len(parts)} parts, scratch {scratch}, budget {args.budget_s:g} s")
    for reason in missing_optional:
        print(f"warning: {reason} is not importable: no GPU energy (NVML) in this run")
    try:
        start_generation(check, sorted({part.benchmark for part in parts if part.benchmark}))
        sources, check.energy_unavailable = default_sources()
        check.monitor = EnergyMonitor(sources, check.energy_unavailable, period_s=ENERGY_PERIOD_S).start()
        for source in sources:
            print(f"energy: {source.description}")
        for reason in check.energy_unavailable:
            print(f"energy: unavailable: {reason}")
        for part in planned:
            if part.name in skipped:
                check.results.append({"part": part.name, "status": skipped[part.name], "elapsed_s": 0.0})
            else:
                run_part(check, part)
    finally:
        if check.monitor is not None:
            check.monitor.stop()
        if check.pool is not None:
            check.pool.shutdown(cancel_futures=True)
        write_outputs(check)
        print_tables(check)
        print(f"\ntotal {time.monotonic() - started:.0f} s; outputs in {args.out}")
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        log.close()
        if not keep_scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    return 1 if any(result["status"].startswith("failed") for result in check.results) else 0
