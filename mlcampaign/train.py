"""One trial: seeded data-parallel training to a quality target, with honest timing, counted FLOPs,
an MLPerf log and a record.

``TrialRun`` is the protocol every framework follows (MLPerf log events, evaluation schedule,
stop at the target, timing bookkeeping, per-rank evidence); ``TorchTrial`` implements it with
torch DistributedDataParallel, ``mlcampaign.tf.trial.KerasTrial`` with Keras and
tf.distribute. Both end in the same record (``build_record``), which only rank 0 writes.

Timing rules (declared in the record):
- throughput = global samples / rank 0's training-step wall time over all steps after the first
  ``warmup_steps`` (data loading included, evaluation excluded);
- a step's wall time = data loading (waiting for the next batch) + compute + ``communication_s``,
  the gradient all-reduce time not hidden behind compute (see ``COMMUNICATION_METHODS``);
- on GPUs the device is synchronised before every timer read;
- time-to-train runs from MLPerf ``run_start`` (after model and data setup) to ``run_stop``
  and includes evaluation; training stops at the first evaluation that meets the target.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import logging
import math
import socket
import time
import traceback
from pathlib import Path

import torch
from mlperf_logging import mllog
from mlperf_logging.mllog.mllog import MLLogger
from torch.utils.data import DataLoader, Subset
from torch.utils.data.distributed import DistributedSampler

from mlcampaign import models
from mlcampaign.config import batch_sizes, scaled_lr
from mlcampaign.data.manifest import DatasetError, read_manifest
from mlcampaign.data.readers import open_split
from mlcampaign.data.staging import stage_to_node
from mlcampaign.distributed import (
    MissingModuleError,
    ProcessLayout,
    check_world_size,
    detect_layout,
    init_torch_process_group,
    require_module,
    torch_device,
)
from mlcampaign.flops import count_flops
from mlcampaign.launch import threads_per_process
from mlcampaign.optim import LARS, lars_param_groups
from mlcampaign.record import SCHEMA_VERSION, provenance, read_record, utc_now, validate_record, write_json_atomic
from mlcampaign.roofline import MatmulPeak, measure_process_peak, roofline_block
from mlcampaign.scheduler import NO_DEADLINE, Deadline, launch_failure_reason
from mlcampaign.seeding import seed_everything

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

# What communication_s and allreduce_in_flight_s measure, per framework and backend (in the record).
COMMUNICATION_METHODS = {
    ("torch", "native"): (
        "DDP communication hook timing: each gradient bucket's all-reduce (with its fp16/bf16 cast when "
        "compressed) runs from the hook's call to its future's completion (CUDA events on GPUs). "
        "allreduce_in_flight_s is the union of these intervals, overlap with backward included; "
        "communication_s is the part after the last bucket was launched (backward compute finished), "
        "i.e. not hidden by compute. DDP's broadcast of BatchNorm buffers before each forward is not a "
        "gradient all-reduce and counts as compute"
    ),
    ("torch", "horovod"): (
        "wall time of the blocking Horovod grouped all-reduce of all gradients after backward "
        "(nothing overlaps it, so communication_s = allreduce_in_flight_s)"
    ),
    ("tensorflow", "native"): (
        "wall time of the separate tf.function that all-reduces the gradients with the strategy's "
        "collectives after backward (nothing overlaps it, so communication_s = allreduce_in_flight_s)"
    ),
    ("tensorflow", "horovod"): (
        "wall time of the Horovod all-reduce of all gradients after backward "
        "(nothing overlaps it, so communication_s = allreduce_in_flight_s)"
    ),
}


class TrainingDiverged(RuntimeError):
    """The training loss became NaN or infinite."""


class TrialTimeout(RuntimeError):
    """The trial reached its deadline (the job's time limit less a margin) before the target."""


def classify_failure(exc: BaseException) -> str:
    """Map an exception to a failure reason of the record schema."""
    out_of_memory = isinstance(exc, torch.OutOfMemoryError | MemoryError)
    out_of_memory |= type(exc).__name__ == "ResourceExhaustedError"  # TensorFlow's
    message = str(exc).lower()
    # torch's CPU allocator refuses with a plain RuntimeError "DefaultCPUAllocator: can't allocate memory".
    if out_of_memory or "out of memory" in message or "can't allocate memory" in message:
        return "out_of_memory"
    if isinstance(exc, TrainingDiverged):
        return "diverged"
    if isinstance(exc, TrialTimeout):
        return "timeout"
    if isinstance(exc, DatasetError):
        return "dataset"
    if isinstance(exc, (NotImplementedError, MissingModuleError)):
        return "unsupported"
    return "error"


def devices_used(system: dict, trial: dict) -> int:
    """Devices a trial occupies: one per process on accelerators; whole nodes on CPU systems."""
    if system["device"] == "cpu":
        return trial["nodes"] * system["devices_per_node"]
    return trial["processes"]


def _lr_lambda(schedule: dict, steps_per_epoch: int, total_steps: int):
    """The learning-rate factor of each step (0-based), shared by every framework."""
    warmup = int(schedule["warmup_epochs"] * steps_per_epoch)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        if schedule["name"] == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        if schedule["name"] == "polynomial":
            return (1.0 - progress) ** schedule["power"]
        if schedule["name"] == "step":
            passed = [m for m in schedule["milestones"] if step >= m["epoch"] * steps_per_epoch]
            return max(passed, key=lambda m: m["epoch"])["factor"] if passed else 1.0
        return 1.0

    return factor


def _met(value: float, target: dict) -> bool:
    return value >= target["value"] if target["direction"] == "higher" else value <= target["value"]


def weights_digest(arrays) -> str:
    """sha256 of float32 weight arrays (numpy), in order: equal on all ranks iff their weights are bit-identical."""
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(array.astype("float32", copy=False).tobytes())
    return digest.hexdigest()


def _mllogger(path: Path | None, name: str) -> MLLogger:
    """An MLPerf logger writing to ``path`` only (rank 0), or nowhere (other ranks)."""
    logger = logging.getLogger(f"mlcampaign.mllog.{name}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    if path is None:
        logger.addHandler(logging.NullHandler())
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        logger.addHandler(logging.FileHandler(path, mode="w"))
    return MLLogger(logger=logger)


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
        "allreduce_in_flight_s",
        "communication_method",
        "staging_s",
    ]
    return dict.fromkeys(keys) | {"quality_history": []}


class TrialRun:
    """The framework-neutral protocol of a trial; subclasses provide the framework's parts.

    Subclasses implement ``_setup`` (data, model, optimizer; sets ``split_sizes``, ``flop_count``,
    ``steps_per_epoch`` and ``communication``), ``_train_epoch`` (calls ``_step_done`` per step),
    ``_evaluate`` (quality values, evaluation sums all-reduced over ranks), ``_weights_digest``,
    ``_gather`` (a JSON-able value from every rank, in rank order, on every rank) and ``close``.
    """

    framework = ""

    def __init__(self, spec: dict, layout: ProcessLayout, dataset_dir: Path, manifest_path: Path, mllog_path: Path):
        self.spec = spec
        self.trial = spec["trial"]
        self.system = spec["system"]
        self.benchmark = spec["benchmark"]
        self.training = self.benchmark["training"]
        self.layout = layout
        self.world_size = layout.world_size
        self.threads = threads_per_process(self.system, self.trial["tasks_per_node"])
        self.dataset_dir = Path(dataset_dir)
        self.manifest = read_manifest(manifest_path)
        self.mllogger = _mllogger(Path(mllog_path) if layout.is_main else None, f"rank{layout.rank}")
        self.metrics: dict = {}
        self.split_sizes: dict[str, int] = {}
        self.flop_count = None
        self.staging_s: float | None = None
        self.communication: str | None = None
        self.distributed: dict | None = None
        self.steps_per_epoch = 0
        self.deadline = NO_DEADLINE
        self.timing = dict.fromkeys(
            ("steps", "samples_trained", "measured_steps", "measured_samples", "samples_evaluated"), 0
        ) | dict.fromkeys(
            ("data_loading_s", "compute_s", "communication_s", "allreduce_in_flight_s", "train_loop_s", "eval_s"), 0.0
        )

    # -- implemented per framework ---------------------------------------------------------------
    def _setup(self) -> None:
        raise NotImplementedError

    def _train_epoch(self, epoch: int) -> None:
        raise NotImplementedError

    def _evaluate(self) -> dict[str, float]:
        raise NotImplementedError

    def _weights_digest(self) -> str:
        raise NotImplementedError

    def _gather(self, value: dict) -> list[dict]:
        raise NotImplementedError

    def close(self) -> None:
        for handler in list(self.mllogger.logger.handlers):
            self.mllogger.logger.removeHandler(handler)
            handler.close()

    # -- shared ----------------------------------------------------------------------------------
    def _step_done(self, data_s: float, step_s: float, communication_s: float, in_flight_s: float) -> None:
        """Book one training step: ``data_s`` waiting for the batch, ``step_s`` from batch to update done."""
        if self.deadline.passed():
            raise TrialTimeout(f"stopped after {self.timing['steps'] + 1} steps: the job's time limit is near")
        timing = self.timing
        timing["steps"] += 1
        timing["samples_trained"] += self.global_batch
        if timing["steps"] > self.training["warmup_steps"]:
            timing["measured_steps"] += 1
            timing["measured_samples"] += self.global_batch
            timing["data_loading_s"] += data_s
            timing["compute_s"] += step_s - communication_s
            timing["communication_s"] += communication_s
            timing["allreduce_in_flight_s"] += in_flight_s

    def _open_data(self, shape: tuple[int, ...]) -> None:
        """Readers of the staged splits, and loaders: this rank's share of shuffled training batches, and
        of the validation set. Every rank shuffles with the trial seed and takes its share, so global
        batch k holds the same samples at every scale (strong scaling) and in every framework."""
        training, layout, dataset = self.training, self.layout, self.benchmark["dataset"]
        train_set = open_split(dataset["format"], self.dataset_dir, "train", shape, dataset["reader_options"])
        val_set = open_split(dataset["format"], self.dataset_dir, "val", shape, dataset["reader_options"])
        self.split_sizes = {"train": len(train_set), "val": len(val_set)}
        if len(val_set) < self.world_size:
            raise ValueError(f"the validation split has {len(val_set)} samples, fewer than {self.world_size} ranks")
        self.sampler = DistributedSampler(
            train_set,
            num_replicas=self.world_size,
            rank=layout.rank,
            shuffle=True,
            seed=self.trial["seed"],
            drop_last=True,
        )
        self.train_loader = DataLoader(
            train_set,
            batch_size=self.local_batch,
            sampler=self.sampler,
            drop_last=True,
            num_workers=training["data_workers"],
            collate_fn=self.model_spec.collate,
        )
        self.val_loader = DataLoader(
            Subset(val_set, range(layout.rank, len(val_set), self.world_size)),
            batch_size=training["eval_batch_size"],
            num_workers=training["data_workers"],
            collate_fn=self.model_spec.collate,
        )
        self.steps_per_epoch = len(self.train_loader)
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"the training split has {len(train_set)} samples, fewer than one global batch of {self.global_batch}"
            )

    def _stage(self) -> None:
        """MLPerf staging (outside run_start..run_stop, as HPC v3.0 allows): a verified copy of the
        dataset in the system's ``staging_dir``, or one verification in place per node; timed as ``staging_s``."""
        constants = mllog.constants
        self.mllogger.start(key=constants.STAGING_START)
        start = time.perf_counter()
        if self.system["staging_dir"] is not None or self.layout.local_rank == 0:
            self.dataset_dir = stage_to_node(self.dataset_dir, self.manifest, self.system["staging_dir"])
        self.staging_s = time.perf_counter() - start
        self.mllogger.end(key=constants.STAGING_STOP, metadata={"staging_s": self.staging_s})

    def _log_setup(self) -> None:
        constants = mllog.constants
        for key, value in (
            (constants.GLOBAL_BATCH_SIZE, self.global_batch),
            (constants.OPT_NAME, self.training["optimizer"]["name"]),
            (constants.OPT_BASE_LR, self.learning_rate),
            (constants.TRAIN_SAMPLES, self.split_sizes["train"]),
            (constants.EVAL_SAMPLES, self.split_sizes["val"]),
        ):
            self.mllogger.event(key=key, value=value)

    def _summarise_ranks(self) -> None:
        """Gather every rank's final weights digest and time split (the per-rank evidence of the record)."""
        timing = self.timing
        mine = {
            "rank": self.layout.rank,
            "host": socket.gethostname(),
            "weights_sha256": self._weights_digest(),
            "data_loading_s": timing["data_loading_s"],
            "compute_s": timing["compute_s"],
            "communication_s": timing["communication_s"],
        }
        self.distributed = self.distributed_block(self._gather(mine))

    def distributed_block(self, ranks: list[dict]) -> dict:
        """The record's ``distributed`` block for the per-rank entries ``ranks`` (empty when training failed)."""
        return {
            "world_size": self.world_size,
            "launcher": self.system["launcher"],
            "rank_environment": self.layout.source,
            "communication": self.communication,
            "ranks": ranks,
            "weights_consistent": len({rank["weights_sha256"] for rank in ranks}) == 1 if ranks else None,
        }

    def run(self) -> dict:
        constants = mllog.constants
        training, target = self.training, self.benchmark["target"]
        check_world_size(self.layout, self.trial["processes"])
        self.global_batch, self.local_batch = batch_sizes(training, self.world_size)
        self.learning_rate = scaled_lr(training, self.global_batch)
        self.mllogger.start(key=constants.INIT_START)
        self.mllogger.event(key=constants.SUBMISSION_BENCHMARK, value=self.benchmark["name"])
        self.mllogger.event(key=constants.SUBMISSION_PLATFORM, value=self.system["accelerator"])
        self.mllogger.event(key=constants.SEED, value=self.trial["seed"])
        self._setup()
        self._log_setup()
        self.mllogger.end(key=constants.INIT_STOP)

        timing = self.timing
        history = []
        # MLPerf HPC logs a lower-is-better quality (CosmoFlow's MAE) as eval_error; the package has no
        # constant for it.
        eval_key = constants.EVAL_ACCURACY if target["direction"] == "higher" else "eval_error"
        epochs_to_target = None
        quality = None
        self.mllogger.start(key=constants.RUN_START)
        run_start = self._now()
        epoch = 0
        for epoch in range(1, training["epochs_max"] + 1):
            self.mllogger.start(key=constants.EPOCH_START, metadata={"epoch_num": epoch})
            loop_start = self._now()
            self._train_epoch(epoch)
            timing["train_loop_s"] += self._now() - loop_start
            self.mllogger.end(key=constants.EPOCH_STOP, metadata={"epoch_num": epoch})
            if epoch % training["eval_every"] and epoch != training["epochs_max"]:
                continue
            self.mllogger.start(key=constants.EVAL_START, metadata={"epoch_num": epoch})
            eval_start = self._now()
            values = self._evaluate()
            timing["eval_s"] += self._now() - eval_start
            timing["samples_evaluated"] += self.split_sizes["val"]
            quality = values[target["metric"]]
            history.append({"epoch": epoch, "value": quality})
            self.mllogger.event(key=eval_key, value=quality, metadata={"epoch_num": epoch})
            self.mllogger.end(key=constants.EVAL_STOP, metadata={"epoch_num": epoch})
            if _met(quality, target):
                epochs_to_target = epoch
                break
        time_to_train = self._now() - run_start
        reached = epochs_to_target is not None
        self.mllogger.end(
            key=constants.RUN_STOP,
            metadata={"status": constants.SUCCESS if reached else constants.ABORTED, "epoch_num": epoch},
        )
        step_time = timing["data_loading_s"] + timing["compute_s"] + timing["communication_s"]
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
            "communication_s": timing["communication_s"],
            "allreduce_in_flight_s": timing["allreduce_in_flight_s"],
            "communication_method": COMMUNICATION_METHODS[(self.framework, self.trial["backend"])]
            if self.world_size > 1
            else "one process: no gradient all-reduce",
            "staging_s": self.staging_s,
            "quality_history": history,
        }
        self._summarise_ranks()
        return self.metrics

    def _now(self) -> float:
        return time.perf_counter()


# -- torch ----------------------------------------------------------------------------------------
class AllreduceTimer:
    """A DDP communication hook that times the hook it wraps, bucket by bucket.

    Each interval runs from the hook's call (the bucket's gradients are ready; a compressing hook
    casts them first) to the completion of the all-reduce future. On CUDA the ends are CUDA events
    recorded in the future's callback, which runs on streams synchronised with the collective.
    """

    def __init__(self, hook, device: torch.device):
        self.hook = hook
        functools.update_wrapper(self, hook)  # DDP checks the hook's name (bf16 needs a recent NCCL)
        self.cuda = device.type == "cuda"
        self.intervals: list[tuple] = []

    def _mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def __call__(self, state, bucket):
        launched = self._mark()

        def finished(future):
            self.intervals.append((launched, self._mark()))
            return future.value()

        return self.hook(state, bucket).then(finished)

    def take_step(self) -> tuple[float, float]:
        """(exposed, in flight) seconds of the step just synchronised; clears the intervals."""
        intervals, self.intervals = self.intervals, []
        if not intervals:
            return 0.0, 0.0
        if self.cuda:
            origin = intervals[0][0]
            intervals = [(origin.elapsed_time(a) / 1e3, origin.elapsed_time(b) / 1e3) for a, b in intervals]
        intervals.sort()
        in_flight, covered_until = 0.0, -math.inf
        for start, end in intervals:
            in_flight += max(0.0, end - max(start, covered_until))
            covered_until = max(covered_until, end)
        exposed = max(0.0, max(end for _, end in intervals) - max(start for start, _ in intervals))
        return exposed, in_flight


class _SingleProcess:
    """Collectives of a one-process trial."""

    description = None

    def sum_(self, tensor: torch.Tensor) -> None:
        pass

    def broadcast_buffers(self, module: torch.nn.Module) -> None:
        pass

    def gather(self, value: dict) -> list[dict]:
        return [value]

    def close(self) -> None:
        pass


class _TorchDistributed:
    """Collectives of torch.distributed (gloo, NCCL or RCCL)."""

    def __init__(self, description: str):
        self.description = description

    def sum_(self, tensor: torch.Tensor) -> None:
        torch.distributed.all_reduce(tensor)

    def broadcast_buffers(self, module: torch.nn.Module) -> None:
        for buffer in module.buffers():
            torch.distributed.broadcast(buffer, src=0)

    def gather(self, value: dict) -> list[dict]:
        values: list = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(values, value)
        return values

    def close(self) -> None:
        torch.distributed.destroy_process_group()


class _Horovod:
    """Collectives of horovod.torch."""

    description = "horovod"

    def __init__(self, hvd, compression: str):
        self.hvd = hvd
        self.compression = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}[compression]

    def sum_(self, tensor: torch.Tensor) -> None:
        tensor.copy_(self.hvd.allreduce(tensor, op=self.hvd.Sum))

    def broadcast_buffers(self, module: torch.nn.Module) -> None:
        for buffer in module.buffers():
            self.hvd.broadcast_(buffer, root_rank=0)

    def average_gradients(self, parameters: list[torch.nn.Parameter]) -> None:
        grads = [p.grad for p in parameters if p.grad is not None]
        for grad, reduced in zip(
            grads, self.hvd.grouped_allreduce(grads, op=self.hvd.Average, compression=self.compression), strict=True
        ):
            grad.copy_(reduced)

    def gather(self, value: dict) -> list[dict]:
        return self.hvd.allgather_object(value)

    def close(self) -> None:
        self.hvd.shutdown()


def _memory_format(sample_shape: tuple[int, ...]) -> torch.memory_format:
    formats = {3: torch.channels_last, 4: torch.channels_last_3d}
    if len(sample_shape) not in formats:
        raise ValueError(f"channels_last applies to image or volume inputs, not samples of shape {sample_shape}")
    return formats[len(sample_shape)]


def _optimizer(params, optimizer: dict, lr: float) -> torch.optim.Optimizer:
    if optimizer["name"] == "sgd":
        return torch.optim.SGD(
            params,
            lr=lr,
            momentum=optimizer["momentum"],
            nesterov=optimizer["nesterov"],
            weight_decay=optimizer["weight_decay"],
        )
    if optimizer["name"] == "lars":
        return LARS(
            lars_param_groups(params),
            lr=lr,
            momentum=optimizer["momentum"],
            weight_decay=optimizer["weight_decay"],
            eta=optimizer["trust_coefficient"],
        )
    optimizer_class = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[optimizer["name"]]
    return optimizer_class(params, lr=lr, weight_decay=optimizer["weight_decay"])


def _map_tensors(function, value):
    """``function`` applied to every tensor of ``value``: a tensor, or lists, tuples and dicts of them
    (the targets and outputs of detection models)."""
    if isinstance(value, torch.Tensor):
        return function(value)
    if isinstance(value, dict):
        return {key: _map_tensors(function, item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_map_tensors(function, item) for item in value)
    return value


def _on_host(tensor: torch.Tensor) -> torch.Tensor:
    """A model output on the host, floating point as float32 (autocast may have made it half precision)."""
    return tensor.detach().to("cpu", torch.float32 if tensor.is_floating_point() else tensor.dtype)


class TorchTrial(TrialRun):
    """PyTorch: DistributedDataParallel (or Horovod), autocast precision, compressed all-reduce hooks."""

    framework = "torch"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.device = torch.device("cpu")  # until _setup picks this rank's device

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _connect(self) -> None:
        layout, trial = self.layout, self.trial
        if trial["backend"] == "horovod":
            hvd = require_module("horovod.torch", "backend 'horovod' of framework torch")
            hvd.init()
            if (hvd.rank(), hvd.size()) != (layout.rank, layout.world_size):
                raise RuntimeError(
                    f"Horovod sees rank {hvd.rank()} of {hvd.size()}, the launcher {layout.rank} of {layout.world_size}"
                )
            self.collectives = _Horovod(hvd, trial["compression"])
        elif layout.world_size > 1:
            backend = init_torch_process_group(layout, self.system["device"], self.device)
            self.collectives = _TorchDistributed(backend)
        else:
            self.collectives = _SingleProcess()
        self.communication = self.collectives.description

    def _setup(self) -> None:
        training, trial, layout = self.training, self.trial, self.layout
        seed_everything(trial["seed"], self.spec["deterministic"])
        torch.set_num_threads(self.threads)
        self.device = torch_device(self.system["device"], layout)
        self._connect()

        self._stage()
        model_config = self.benchmark["model"]
        self.model_spec = models.get(model_config["name"])
        shape = self.model_spec.sample_shape(**model_config["options"])
        self._open_data(shape)

        self.memory_format = _memory_format(shape) if training["channels_last"] else torch.contiguous_format
        self.model = self.model_spec.build(**model_config["options"]).to(self.device, memory_format=self.memory_format)
        self.parameters = list(self.model.parameters())
        self.allreduce_timer = None
        self.network = self.model
        if isinstance(self.collectives, _TorchDistributed):
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            self.network = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device] if self.device.type == "cuda" else None
            )
            hook = {
                "none": default_hooks.allreduce_hook,
                "fp16": default_hooks.fp16_compress_hook,
                "bf16": default_hooks.bf16_compress_hook,
            }[trial["compression"]]
            self.allreduce_timer = AllreduceTimer(hook, self.device)
            self.network.register_comm_hook(state=None, hook=self.allreduce_timer)
        elif isinstance(self.collectives, _Horovod):
            self.collectives.hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)

        self.criterion = self.model_spec.criterion(training)
        self.optimizer = _optimizer(self.parameters, training["optimizer"], self.learning_rate)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            _lr_lambda(training["schedule"], self.steps_per_epoch, self.steps_per_epoch * training["epochs_max"]),
        )
        precision = trial["precision"]
        self.autocast = (
            torch.autocast(self.device.type, dtype=AUTOCAST_DTYPES[precision])
            if precision in AUTOCAST_DTYPES
            else contextlib.nullcontext()
        )
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=precision == "fp16")
        if layout.is_main:
            self.flop_count = count_flops(
                self.model_spec.counted_work or self.model_spec.build, model_config["options"], shape
            )

    def _to_device(self, inputs: torch.Tensor) -> torch.Tensor:
        return inputs.to(self.device, memory_format=self.memory_format)

    def _train_epoch(self, epoch: int) -> None:
        self.network.train()
        self.sampler.set_epoch(epoch)
        step_start = self._now()
        for inputs, targets in self.train_loader:
            inputs, targets = self._to_device(inputs), _map_tensors(lambda t: t.to(self.device), targets)
            loaded = self._now()
            self.optimizer.zero_grad(set_to_none=True)
            with self.autocast:
                outputs = (
                    self.network(inputs, targets) if self.model_spec.forward_takes_targets else self.network(inputs)
                )
                loss = self.criterion(outputs, targets)
            if not torch.isfinite(loss):
                raise TrainingDiverged(f"loss is {loss.item()} at epoch {epoch}, step {self.timing['steps']}")
            self.scaler.scale(loss).backward()  # DDP all-reduces gradient buckets during backward
            reduce_s = self._horovod_allreduce()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.scheduler.step()
            step_end = self._now()
            exposed, in_flight = self.allreduce_timer.take_step() if self.allreduce_timer else (reduce_s, reduce_s)
            self._step_done(loaded - step_start, step_end - loaded, exposed, in_flight)
            step_start = self._now()

    def _horovod_allreduce(self) -> float:
        """Average the gradients over the Horovod ranks after backward; its wall time (0 without Horovod)."""
        if not isinstance(self.collectives, _Horovod):
            return 0.0
        start = self._now()
        self.collectives.average_gradients(self.parameters)
        return self._now() - start

    def _evaluate(self) -> dict[str, float]:
        # Rank 0's BatchNorm statistics everywhere, as DDP broadcasts them before every training forward.
        self.collectives.broadcast_buffers(self.model)
        self.model.eval()
        if self.model_spec.quality_metric is not None:
            return self._evaluate_with_metric()
        sums: dict[str, torch.Tensor] = {}
        with torch.no_grad(), self.autocast:
            for inputs, targets in self.val_loader:
                outputs = self.model(self._to_device(inputs)).float()
                for key, value in self.model_spec.eval_sums(outputs, targets.to(self.device)).items():
                    sums[key] = sums.get(key, 0) + value
        keys = sorted(sums)
        totals = torch.stack([sums[key].to(self.device, torch.float64) for key in keys])
        self.collectives.sum_(totals)
        return self.model_spec.eval_finalize(dict(zip(keys, totals.tolist(), strict=True)))

    def _evaluate_with_metric(self) -> dict[str, float]:
        """Quality from a metric that is not a sum over samples (mAP): every rank's outputs and targets are
        gathered to every rank, in rank order, and go through one metric there. (torchmetrics' own
        synchronisation gathers one tensor per image, which deadlocks when ranks hold different numbers
        of validation images, and works with torch.distributed only.)"""
        batches = []
        with torch.no_grad(), self.autocast:
            for inputs, targets in self.val_loader:
                batches.append((_map_tensors(_on_host, self.model(self._to_device(inputs))), targets))
        metric = self.model_spec.quality_metric()
        for rank_batches in self._gather(batches):
            for outputs, targets in rank_batches:
                metric.update(outputs, targets)
        values = {key: value.item() for key, value in metric.compute().items() if value.numel() == 1}
        return self.model_spec.eval_finalize(values)

    def _weights_digest(self) -> str:
        return weights_digest(p.detach().float().cpu().numpy() for p in self.model.parameters())

    def _gather(self, value: dict) -> list[dict]:
        return self.collectives.gather(value)

    def close(self) -> None:
        super().close()
        if hasattr(self, "collectives"):
            self.collectives.close()


TRIAL_CLASSES = {"torch": "mlcampaign.train:TorchTrial", "tensorflow": "mlcampaign.tf.trial:KerasTrial"}


def trial_class(framework: str) -> type[TrialRun]:
    """The TrialRun implementation of a framework (imported only when used)."""
    module, name = TRIAL_CLASSES[framework].split(":")
    return getattr(importlib.import_module(module), name)


# -- records --------------------------------------------------------------------------------------
FLOP_METHODS = {
    "torch": "torch.utils.flop_counter (conv/matmul; multiply-add = 2 FLOPs)",
    "tensorflow": "tf.profiler float_operation on the Keras model's graphs (conv/matmul; multiply-add = 2 FLOPs)",
}


def build_record(
    spec: dict,
    manifest: dict,
    split_sizes: dict,
    metrics: dict,
    flop_count,
    failure: dict | None,
    started: str,
    distributed: dict | None = None,
    roofline_peak: MatmulPeak | None = None,
) -> dict:
    """The trial record (config/schemas/record.schema.yaml) of any framework.

    ``distributed`` is the gathered per-rank block; a trial that failed before gathering gets one
    with null values and no ranks. ``roofline_peak``: rank 0's measured matmul peak (none when the
    trial failed before measuring it).
    """
    trial, system, benchmark = spec["trial"], spec["system"], spec["benchmark"]
    training = benchmark["training"]
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
    flops["method"] = FLOP_METHODS[trial["framework"]]
    global_batch, local_batch = batch_sizes(training, trial["processes"])
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
                "compression",
                "framework",
                "backend",
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
            "target_value": benchmark["target"]["value"],
            "target_direction": benchmark["target"]["direction"],
            "global_batch_size": global_batch,
            "local_batch_size": local_batch,
            "batch_scaling": training["batch_scaling"],
            "learning_rate": scaled_lr(training, global_batch),
            "lr_scaling": training["lr_scaling"]["rule"],
            # Keras convolutions run channels-last always; torch as configured.
            "channels_last": trial["framework"] == "tensorflow" or training["channels_last"],
        },
        "dataset": {
            "name": manifest["name"],
            "dataset_id": manifest["dataset_id"],
            "train_samples": split_sizes.get("train"),
            "eval_samples": split_sizes.get("val"),
        },
        "metrics": metrics,
        "flops": flops,
        "roofline": roofline_block(roofline_peak, trial["processes"], flops["achieved_flops_per_s"]),
        "distributed": distributed
        or {
            "world_size": None,
            "launcher": system["launcher"],
            "rank_environment": None,
            "communication": None,
            "ranks": [],
            "weights_consistent": None,
        },
        "provenance": provenance(started),
    }


def run_trial(
    spec: dict,
    dataset_dir: Path,
    manifest_path: Path,
    record_path: Path,
    mllog_path: Path,
    deadline: Deadline = NO_DEADLINE,
) -> dict:
    """Run this process's part of a trial; rank 0 writes the record (a failure record if training fails).

    Training stops with the reason ``timeout`` once ``deadline`` has passed (checked after every
    step). Returns the record (on every rank).
    """
    started = utc_now()
    layout = detect_layout()
    trial = trial_class(spec["trial"]["framework"])(spec, layout, dataset_dir, manifest_path, mllog_path)
    trial.deadline = deadline
    peak = None
    try:
        peak = measure_process_peak(spec["system"], spec["trial"], layout)  # about 1 s, before training
        metrics, failure = trial.run(), None
    except (Exception, torch.OutOfMemoryError) as exc:  # every failure becomes a record with its reason
        traceback.print_exc()
        metrics = trial.metrics or _empty_metrics()
        # Past the deadline, a rank's failure is the timeout (another rank may have stopped first).
        reason = "timeout" if deadline.passed() else classify_failure(exc)
        failure = {"reason": reason, "message": f"{type(exc).__name__}: {exc}"}
    finally:
        trial.close()
    distributed = trial.distributed or trial.distributed_block([])
    record = build_record(
        spec, trial.manifest, trial.split_sizes, metrics, trial.flop_count, failure, started, distributed, peak
    )
    validate_record(record)
    if layout.is_main:
        write_json_atomic(record, record_path)
    return record


def record_launch_failure(spec: dict, manifest_path: Path, record_path: Path, mllog_path: Path, status: int) -> dict:
    """After a launch that exited with ``status``: keep rank 0's record, or write a failure record if there is none."""
    record_path, mllog_path = Path(record_path), Path(mllog_path)
    mllog_path.touch()
    if record_path.exists():
        return read_record(record_path)
    reason, explanation = launch_failure_reason(status)
    failure = {
        "reason": reason,
        "message": f"the launcher exited with status {status} before rank 0 wrote a record ({explanation})",
    }
    record = build_record(
        spec, read_manifest(manifest_path), {}, _empty_metrics(), None, failure, utc_now(), distributed=None
    )
    validate_record(record)
    write_json_atomic(record, record_path)
    return record
