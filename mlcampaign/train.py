"""One trial: seeded training to a quality target, with honest timing, counted FLOPs and an MLPerf log.

Timing rules (declared in the record):
- throughput = global samples / training-step wall time over all steps after the first
  ``warmup_steps`` (data loading included, evaluation excluded);
- on GPUs the device is synchronised before every timer read;
- time-to-train runs from MLPerf ``run_start`` (after model and data setup) to ``run_stop``
  and includes evaluation; training stops at the first evaluation that meets the target.
"""

from __future__ import annotations

import contextlib
import math
import time
import traceback
from pathlib import Path

import torch
from mlperf_logging import mllog
from torch.utils.data import DataLoader

from mlcampaign import models
from mlcampaign.data.manifest import DatasetError, read_manifest, verify
from mlcampaign.data.readers import open_split
from mlcampaign.flops import count_flops
from mlcampaign.record import SCHEMA_VERSION, provenance, utc_now, validate_record, write_json_atomic
from mlcampaign.seeding import seed_everything

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class TrainingDiverged(RuntimeError):
    """The training loss became NaN or infinite."""


def classify_failure(exc: BaseException) -> str:
    """Map an exception to a failure reason of the record schema."""
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower():
        return "out_of_memory"
    if isinstance(exc, TrainingDiverged):
        return "diverged"
    if isinstance(exc, DatasetError):
        return "dataset"
    if isinstance(exc, NotImplementedError):
        return "unsupported"
    return "error"


def devices_used(system: dict, trial: dict) -> int:
    """Devices a trial occupies: one per process on accelerators; whole nodes on CPU systems."""
    if system["device"] == "cpu":
        return trial["nodes"] * system["devices_per_node"]
    return trial["processes"]


class _Synchronizer:
    """Reads a timer only after the device has finished queued work."""

    def __init__(self, device: torch.device):
        self.device = device

    def now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()


def _lr_lambda(schedule: dict, steps_per_epoch: int, total_steps: int):
    warmup = int(schedule["warmup_epochs"] * steps_per_epoch)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        if schedule["name"] == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        if schedule["name"] == "polynomial":
            return (1.0 - progress) ** schedule["power"]
        return 1.0

    return factor


def _optimizer(params, optimizer: dict, lr: float) -> torch.optim.Optimizer:
    if optimizer["name"] == "sgd":
        return torch.optim.SGD(
            params,
            lr=lr,
            momentum=optimizer["momentum"],
            nesterov=optimizer["nesterov"],
            weight_decay=optimizer["weight_decay"],
        )
    optimizer_class = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[optimizer["name"]]
    return optimizer_class(params, lr=lr, weight_decay=optimizer["weight_decay"])


def _met(value: float, target: dict) -> bool:
    return value >= target["value"] if target["direction"] == "higher" else value <= target["value"]


class Trial:
    """Runs one trial described by a spec (the planned matrix row plus its system and benchmark configs)."""

    def __init__(self, spec: dict, dataset_dir: Path, manifest_path: Path, mllog_path: Path):
        self.spec = spec
        self.trial = spec["trial"]
        self.system = spec["system"]
        self.benchmark = spec["benchmark"]
        self.dataset_dir = Path(dataset_dir)
        self.manifest = read_manifest(manifest_path)
        self.world_size = 1
        self.device = torch.device("cpu")
        self.sync = _Synchronizer(self.device)
        mllog_path = Path(mllog_path)
        mllog_path.parent.mkdir(parents=True, exist_ok=True)
        mllog_path.unlink(missing_ok=True)
        mllog.config(filename=str(mllog_path))
        self.mllogger = mllog.get_mllogger()
        self.metrics: dict = {}
        self.split_sizes: dict[str, int] = {}
        self.flop_count = None

    # -- phases -----------------------------------------------------------------------------
    def _setup(self):
        constants = mllog.constants
        training = self.benchmark["training"]
        self.mllogger.start(key=constants.INIT_START)
        self.mllogger.event(key=constants.SUBMISSION_BENCHMARK, value=self.benchmark["name"])
        self.mllogger.event(key=constants.SUBMISSION_PLATFORM, value=self.system["accelerator"])
        self.mllogger.event(key=constants.SEED, value=self.trial["seed"])
        seed_everything(self.trial["seed"], self.spec["deterministic"])
        if "threads_per_process" in self.system:
            torch.set_num_threads(self.system["threads_per_process"])

        verify(self.dataset_dir, self.manifest)
        model_config = self.benchmark["model"]
        self.model_spec = models.get(model_config["name"])
        shape = self.model_spec.sample_shape(**model_config["options"])
        data_format = self.benchmark["dataset"]["format"]
        self.train_set = open_split(data_format, self.dataset_dir, "train", shape)
        self.val_set = open_split(data_format, self.dataset_dir, "val", shape)
        self.split_sizes = {"train": len(self.train_set), "val": len(self.val_set)}

        global_batch = training["global_batch_size"]
        if global_batch % self.world_size:
            raise ValueError(f"global_batch_size {global_batch} is not divisible by {self.world_size} processes")
        self.local_batch = global_batch // self.world_size
        data_order = torch.Generator().manual_seed(self.trial["seed"])
        self.train_loader = DataLoader(
            self.train_set,
            batch_size=self.local_batch,
            shuffle=True,
            drop_last=True,
            generator=data_order,
            num_workers=training["data_workers"],
        )
        self.val_loader = DataLoader(
            self.val_set, batch_size=training["eval_batch_size"], num_workers=training["data_workers"]
        )
        if len(self.train_loader) == 0:
            raise ValueError(
                f"the training split has {len(self.train_set)} samples, fewer than one batch of {self.local_batch}"
            )

        self.model = self.model_spec.build(**model_config["options"]).to(self.device)
        self.criterion = self.model_spec.criterion(training)
        self.optimizer = _optimizer(self.model.parameters(), training["optimizer"], training["optimizer"]["lr"])
        steps_per_epoch = len(self.train_loader)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            _lr_lambda(training["schedule"], steps_per_epoch, steps_per_epoch * training["epochs_max"]),
        )
        precision = self.trial["precision"]
        self.autocast = (
            torch.autocast(self.device.type, dtype=AUTOCAST_DTYPES[precision])
            if precision in AUTOCAST_DTYPES
            else contextlib.nullcontext()
        )
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=precision == "fp16")
        self.flop_count = count_flops(self.model_spec.build, model_config["options"], shape)

        for key, value in (
            (constants.GLOBAL_BATCH_SIZE, global_batch),
            (constants.OPT_NAME, training["optimizer"]["name"]),
            (constants.OPT_BASE_LR, training["optimizer"]["lr"]),
            (constants.TRAIN_SAMPLES, len(self.train_set)),
            (constants.EVAL_SAMPLES, len(self.val_set)),
        ):
            self.mllogger.event(key=key, value=value)
        self.mllogger.end(key=constants.INIT_STOP)

    def _train_epoch(self, epoch: int, timing: dict) -> None:
        self.model.train()
        warmup_steps = self.benchmark["training"]["warmup_steps"]
        step_start = self.sync.now()
        for inputs, targets in self.train_loader:
            inputs, targets = inputs.to(self.device), targets.to(self.device)
            loaded = self.sync.now()
            self.optimizer.zero_grad(set_to_none=True)
            with self.autocast:
                loss = self.criterion(self.model(inputs), targets)
            if not torch.isfinite(loss):
                raise TrainingDiverged(f"loss is {loss.item()} at epoch {epoch}, step {timing['steps']}")
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.scheduler.step()
            step_end = self.sync.now()
            timing["steps"] += 1
            timing["samples_trained"] += self.local_batch * self.world_size
            if timing["steps"] > warmup_steps:
                timing["measured_steps"] += 1
                timing["measured_samples"] += self.local_batch * self.world_size
                timing["data_loading_s"] += loaded - step_start
                timing["compute_s"] += step_end - loaded
            step_start = self.sync.now()

    def _evaluate(self) -> tuple[dict[str, float], int]:
        self.model.eval()
        sums: dict[str, torch.Tensor] = {}
        with torch.no_grad(), self.autocast:
            for inputs, targets in self.val_loader:
                outputs = self.model(inputs.to(self.device)).float()
                for key, value in self.model_spec.eval_sums(outputs, targets.to(self.device)).items():
                    sums[key] = sums.get(key, 0) + value
        totals = {key: float(value) for key, value in sums.items()}
        return self.model_spec.eval_finalize(totals), len(self.val_set)

    def run(self) -> dict:
        constants = mllog.constants
        training = self.benchmark["training"]
        target = self.benchmark["target"]
        self._setup()
        timing = dict.fromkeys(
            ("steps", "samples_trained", "measured_steps", "measured_samples", "samples_evaluated"), 0
        )
        timing.update(data_loading_s=0.0, compute_s=0.0, eval_s=0.0, train_loop_s=0.0)
        history = []
        epochs_to_target = None
        quality = None
        self.mllogger.start(key=constants.RUN_START)
        run_start = self.sync.now()
        epoch = 0
        for epoch in range(1, training["epochs_max"] + 1):
            self.mllogger.start(key=constants.EPOCH_START, metadata={"epoch_num": epoch})
            loop_start = self.sync.now()
            self._train_epoch(epoch, timing)
            timing["train_loop_s"] += self.sync.now() - loop_start
            self.mllogger.end(key=constants.EPOCH_STOP, metadata={"epoch_num": epoch})
            if epoch % training["eval_every"] and epoch != training["epochs_max"]:
                continue
            self.mllogger.start(key=constants.EVAL_START, metadata={"epoch_num": epoch})
            eval_start = self.sync.now()
            values, evaluated = self._evaluate()
            timing["eval_s"] += self.sync.now() - eval_start
            timing["samples_evaluated"] += evaluated
            quality = values[target["metric"]]
            history.append({"epoch": epoch, "value": quality})
            self.mllogger.event(key=constants.EVAL_ACCURACY, value=quality, metadata={"epoch_num": epoch})
            self.mllogger.end(key=constants.EVAL_STOP, metadata={"epoch_num": epoch})
            if _met(quality, target):
                epochs_to_target = epoch
                break
        time_to_train = self.sync.now() - run_start
        reached = epochs_to_target is not None
        self.mllogger.end(
            key=constants.RUN_STOP,
            metadata={"status": constants.SUCCESS if reached else constants.ABORTED, "epoch_num": epoch},
        )
        step_time = timing["data_loading_s"] + timing["compute_s"]
        throughput = timing["measured_samples"] / step_time if timing["measured_steps"] else None
        self.metrics = {
            "reached_target": reached,
            "achieved_quality": quality,
            "epochs_to_target": epochs_to_target,
            "epochs_run": epoch,
            "time_to_train_s": time_to_train,
            "throughput_samples_per_s": throughput,
            "warmup_steps_excluded": min(training["warmup_steps"], timing["steps"]),
            "samples_trained": timing["samples_trained"],
            "samples_evaluated": timing["samples_evaluated"],
            "train_loop_s": timing["train_loop_s"],
            "eval_s": timing["eval_s"],
            "data_loading_s": timing["data_loading_s"],
            "compute_s": timing["compute_s"],
            "communication_s": 0.0,
            "quality_history": history,
        }
        return self.metrics


def _empty_metrics() -> dict:
    keys = [
        "reached_target",
        "achieved_quality",
        "epochs_to_target",
        "epochs_run",
        "time_to_train_s",
        "throughput_samples_per_s",
        "warmup_steps_excluded",
        "samples_trained",
        "samples_evaluated",
        "train_loop_s",
        "eval_s",
        "data_loading_s",
        "compute_s",
        "communication_s",
    ]
    return dict.fromkeys(keys) | {"quality_history": []}


def build_record(
    spec: dict, manifest: dict, split_sizes: dict, metrics: dict, flop_count, failure: dict | None, started: str
) -> dict:
    trial, system, benchmark = spec["trial"], spec["system"], spec["benchmark"]
    n_devices = devices_used(system, trial)
    peak_per_device = system["peak_flops_per_device"].get(trial["precision"])
    peak = peak_per_device * n_devices if peak_per_device else None
    flops = dict.fromkeys(
        ("train_per_sample", "forward_per_sample", "total", "achieved_flops_per_s", "fraction_of_peak")
    )
    if flop_count is not None:
        flops["train_per_sample"] = flop_count.train_per_sample
        flops["forward_per_sample"] = flop_count.forward_per_sample
        if metrics["samples_trained"] is not None:
            flops["total"] = flop_count.total(metrics["samples_trained"], metrics["samples_evaluated"])
        if metrics["throughput_samples_per_s"]:
            flops["achieved_flops_per_s"] = flop_count.train_per_sample * metrics["throughput_samples_per_s"]
            flops["fraction_of_peak"] = flops["achieved_flops_per_s"] / peak if peak else None
    flops["method"] = "torch.utils.flop_counter (conv/matmul; multiply-add = 2 FLOPs)"
    global_batch = benchmark["training"]["global_batch_size"]
    return {
        "schema_version": SCHEMA_VERSION,
        "status": "failed" if failure else "ok",
        "failure": failure,
        "trial": {
            key: trial[key]
            for key in (
                "system",
                "benchmark",
                "cell",
                "trial",
                "replicate",
                "seed",
                "nodes",
                "tasks_per_node",
                "processes",
                "precision",
            )
        }
        | {"campaign": spec["campaign"], "deterministic": spec["deterministic"]},
        "system": {
            "accelerator": system["accelerator"],
            "device": system["device"],
            "devices_used": n_devices,
            "peak_flops_per_s": peak,
        },
        "benchmark": {
            "model": benchmark["model"]["name"],
            "target_metric": benchmark["target"]["metric"],
            "target_direction": benchmark["target"]["direction"],
            "target_value": benchmark["target"]["value"],
            "global_batch_size": global_batch,
            "local_batch_size": global_batch // trial["processes"],
        },
        "dataset": {
            "name": manifest["name"],
            "dataset_id": manifest["dataset_id"],
            "train_samples": split_sizes.get("train"),
            "eval_samples": split_sizes.get("val"),
        },
        "metrics": metrics,
        "flops": flops,
        "provenance": provenance(started),
    }


def run_trial(spec: dict, dataset_dir: Path, manifest_path: Path, record_path: Path, mllog_path: Path) -> dict:
    """Run a trial and write its record (a failure record if training fails); return the record."""
    started = utc_now()
    trial = Trial(spec, dataset_dir, manifest_path, mllog_path)
    try:
        metrics, failure = trial.run(), None
    except (Exception, torch.OutOfMemoryError) as exc:  # every failure becomes a record with its reason
        traceback.print_exc()
        metrics = trial.metrics or _empty_metrics()
        failure = {"reason": classify_failure(exc), "message": f"{type(exc).__name__}: {exc}"}
    record = build_record(spec, trial.manifest, trial.split_sizes, metrics, trial.flop_count, failure, started)
    validate_record(record)
    write_json_atomic(record, record_path)
    return record
