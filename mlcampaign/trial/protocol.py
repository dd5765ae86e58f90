"""One trial: seeded data-parallel training to a quality target, with honest timing, counted FLOPs,
an MLPerf log and a record.

``TrialRun`` is the protocol every framework follows (MLPerf log events, evaluation schedule,
stop at the target, timing bookkeeping, per-rank evidence); ``mlcampaign.trial.torch.trial.TorchTrial``
implements it with torch DistributedDataParallel, ``mlcampaign.trial.keras.trial.KerasTrial`` with Keras and
tf.distribute. Both end in the same record (mlcampaign.records.builder), which only rank 0 writes.

Timing rules (declared in the record):
- throughput = global samples / rank 0's training-step wall time over all steps after the first
  ``warmup_steps`` (data loading included, evaluation excluded);
- a step's wall time = data loading (waiting for the next batch) + compute + ``communication_s``,
  the gradient all-reduce time not hidden behind compute (see ``COMMUNICATION_METHODS``);
- on GPUs the device is synchronised before every timer read;
- time-to-train runs from MLPerf ``run_start`` (after model and data setup) to ``run_stop``
  and includes evaluation; training stops at the first evaluation that meets the target;
- a compiled training step (torch.compile) is compiled before ``run_start`` and timed apart
  (``compile_s``), as MLPerf counts compilation as model initialization (mlcampaign.trial.torch.trial).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import math
import socket
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Subset
from torch.utils.data.distributed import DistributedSampler

from mlcampaign.data.formats import open_split
from mlcampaign.data.manifest import DatasetError, read_dataset_id, read_manifest, staged_paths
from mlcampaign.data.staging import launch_id, stage_to_node
from mlcampaign.job.deadlines import NO_DEADLINE, Deadline
from mlcampaign.measure.canaries.probe import (
    AFTER_TIMED,
    BEFORE_SETUP,
    BEFORE_TIMED,
    CanaryReading,
    TrialGroup,
    TrialMachine,
    measure_canaries,
)
from mlcampaign.measure.instruments import TrialInstruments
from mlcampaign.measure.roofline import MatmulPeak, measure_matmul_peak
from mlcampaign.measure.software_stack import software_stack
from mlcampaign.plan.canaries import CANARIES
from mlcampaign.plan.hyperparameters import batch_sizes, scaled_lr
from mlcampaign.plan.launchers import threads_per_process
from mlcampaign.plan.metrics import TrialCounters, empty_trial_metrics, trial_metrics
from mlcampaign.plan.registry import PRECISIONS
from mlcampaign.plan.runs import utc_now
from mlcampaign.records.builder import build_record
from mlcampaign.records.files import write_record
from mlcampaign.records.mlperf.trial_log import MLPerfLog, drop_page_cache
from mlcampaign.trial.distributed import (
    MissingDeviceError,
    MissingModuleError,
    ProcessLayout,
    check_world_size,
    detect_layout,
    torch_device,
)

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
ONE_PROCESS = "one process: no gradient all-reduce"


# How long a rank whose trial failed waits for rank 0's record before it exits. Its non-zero exit makes
# the launcher (torchrun, srun) stop the other ranks at once, and rank 0, failing at the same step (a
# loss that diverges does so on every rank), may not have written its failure record yet: the trial
# would then be recorded as a launch that ended without a record (reason error), not as what it was.
# Short beside the job's deadline margin (mlcampaign.job.deadlines.MIN_DEADLINE_MARGIN_S): where rank 0
# instead waits in a collective for this rank, the launcher stops it this much later.
MAIN_RECORD_WAIT_S = 10.0


def await_main_record(record_path: Path, wait_s: float = MAIN_RECORD_WAIT_S, poll_s: float = 0.05) -> bool:
    """Wait up to ``wait_s`` for rank 0's record at ``record_path`` (the trial's supervisor moved any
    earlier one aside before the launch); whether it appeared."""
    waited_until = time.monotonic() + wait_s
    while not record_path.exists():
        if time.monotonic() >= waited_until:
            return False
        time.sleep(poll_s)
    return True


class TrainingDiverged(RuntimeError):
    """The training loss became NaN or infinite."""


class TrialTimeout(RuntimeError):
    """The trial reached its deadline (the job's time limit less a margin) before the target."""


def classify_failure(exc: BaseException) -> str:
    """Map an exception to a failure reason (mlcampaign.plan.registry.FAILURE_REASONS)."""
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
    if isinstance(exc, (NotImplementedError, MissingModuleError, MissingDeviceError)):
        return "unsupported"
    return "error"


def _met(value: float, target: dict) -> bool:
    return value >= target["value"] if target["direction"] == "higher" else value <= target["value"]


def weights_digest(arrays) -> str:
    """sha256 of float32 weight arrays (numpy), in order: equal on all ranks iff their weights are bit-identical."""
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(array.astype("float32", copy=False).tobytes())
    return digest.hexdigest()


@dataclasses.dataclass
class CollectiveGroup:
    """A trial's process group as the all-reduce canary uses it (mlcampaign.measure.canaries.probe.TrialGroup),
    from its framework's parts: ``full(n, value)`` a float32 vector on this rank's device, ``summed`` its sum
    over the ranks (the trial's own collectives), ``synchronize`` waiting for the device."""

    world_size: int
    description: str
    full: Callable[[int, float], Any]
    summed: Callable[[Any], Any]
    synchronize: Callable[[], Any]
    buffer: Any = None

    def prepare(self, buffer_bytes: int) -> None:
        self.buffer = self.full(buffer_bytes // 4, 0.0)

    def allreduce(self) -> None:
        self.summed(self.buffer)
        self.synchronize()

    def everyone(self, ok: bool) -> bool:
        return float(self.summed(self.full(1, 0.0 if ok else 1.0))[0]) == 0.0


class TrialRun:
    """The framework-neutral protocol of a trial; subclasses provide the framework's parts.

    ``prepare`` sets the trial up (batch sizes, learning rate, then the framework's ``_setup``: data,
    model, optimizer; it sets ``split_sizes``, ``flop_count``, ``steps_per_epoch`` and
    ``communication``); ``run`` prepares and trains. Subclasses implement ``_setup``,
    ``_train_epoch`` (calls ``_step_done`` per step), ``_evaluate`` (quality values, evaluation sums
    all-reduced over ranks), ``_weights_digest``, ``_gather`` (a JSON-able value from every rank, in
    rank order, on every rank), ``_canary_group`` (its collectives for the all-reduce canary) and ``close``.

    The canaries (mlcampaign.plan.canaries) are measured in three phases (``measure_canaries``): with the
    roofline before set-up (``run_trial``), right before MLPerf run_start once the process group exists
    (``run``), and after the timed training (``run_trial``: what touches the dataset).
    """

    framework = ""

    def __init__(self, spec: dict, layout: ProcessLayout, dataset_id_path: Path, mllog_path: Path):
        self.spec = spec
        self.trial = spec["trial"]
        self.system = spec["system"]
        self.benchmark = spec["benchmark"]
        self.training = self.benchmark["training"]
        self.layout = layout
        self.world_size = layout.world_size
        self.threads = threads_per_process(self.system, self.trial["tasks_per_node"])
        self.dataset_dir, self.manifest_path = staged_paths(dataset_id_path)
        self.dataset_root = Path(dataset_id_path).parent  # the staged dataset's folder (and its FLOP count cache)
        self.mllog = MLPerfLog.open(Path(mllog_path) if layout.is_main else None, spec)
        self.metrics: dict = {}
        self.split_sizes: dict[str, int] = {}
        self.flop_count = None
        self.communication: str | None = None
        self.distributed: dict | None = None
        self.canaries: dict[str, CanaryReading] = {}
        self.dataset_files: list[Path] = []  # the staged files the trial reads, in content-hash order
        self.compile_cache_dir: str | None = None  # set by a trial that compiles its step
        self.steps_per_epoch = 0
        self.deadline = NO_DEADLINE
        self.measurements = TrialInstruments(node_leader=layout.local_rank == 0)
        self.counters = TrialCounters(
            warmup_steps=self.training["warmup_steps"],
            communication_method=(
                COMMUNICATION_METHODS[(self.framework, self.trial["backend"])] if self.world_size > 1 else ONE_PROCESS
            ),
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

    def _device_memory_peak_bytes(self) -> int | None:
        """This rank's device memory high-water mark (bytes) where its device keeps one; None on CPU."""
        return None

    def _canary_group(self) -> TrialGroup:
        """The trial's process group for the all-reduce canary, after set-up (asked of more than one process)."""
        raise NotImplementedError

    def close(self, failure: str | None = None) -> None:
        """End the trial's MLPerf log (an aborted run_stop where training started and failed)."""
        self.mllog.close(failure)

    # -- shared ----------------------------------------------------------------------------------
    def train_epoch(self, epoch: int) -> None:
        """One training epoch after ``prepare``, exactly as ``run`` times it (its steps booked in ``counters``,
        the declared warm-up and the deadline respected), without MLPerf epoch events or evaluation: what the
        benches time against a bare loop."""
        self._train_epoch(epoch)

    def _step_done(self, data_s: float, step_s: float, communication_s: float, in_flight_s: float) -> None:
        """Book one training step: ``data_s`` waiting for the batch, ``step_s`` from batch to update done."""
        counters = self.counters
        if self.deadline.passed():
            raise TrialTimeout(f"stopped after {counters.steps + 1} steps: the job's time limit is near")
        counters.steps += 1
        counters.samples_trained += self.global_batch
        if counters.steps > counters.warmup_steps:
            counters.measured_steps += 1
            counters.measured_samples += self.global_batch
            counters.data_loading_s += data_s
            counters.compute_s += step_s - communication_s
            counters.communication_s += communication_s
            counters.allreduce_in_flight_s += in_flight_s

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
        dataset in the system's ``staging_dir``, or one verification in place per node, hashed once per
        node and run (mlcampaign.data.staging); timed as ``staging_s``."""
        self.mllog.staging_start()
        start = time.perf_counter()
        manifest = read_manifest(self.manifest_path)
        if self.system["staging_dir"] is not None or self.layout.local_rank == 0:
            run = f"{self.spec['campaign']}/{self.spec['run']['id']}"
            self.dataset_dir = stage_to_node(self.dataset_dir, manifest, self.system["staging_dir"], launch_id(), run)
        self.counters.staging_s = time.perf_counter() - start
        self.mllog.staging_stop(self.counters.staging_s)
        by_content = sorted(manifest["files"], key=lambda entry: entry["sha256"])
        self.dataset_files = [self.dataset_dir / entry["path"] for entry in by_content]

    def measure_canaries(self, phase: str, matmul_peak: MatmulPeak | None = None) -> None:
        """Measure this trial's canaries of ``phase`` (those its cell measures: mlcampaign.plan.canaries) into
        ``canaries``, whose readings rank 0 records; one that cannot be measured is absent, its reason in the
        trial's log. ``matmul_peak``: the roofline measured before set-up."""
        machine = TrialMachine(
            device=torch_device(self.system["device"], self.layout),
            processes=self.world_size,
            local_processes=self.layout.local_world_size,
            matmul_peak=matmul_peak,
            group=self._canary_group() if phase == BEFORE_TIMED and self.world_size > 1 else None,
            dataset_files=self.dataset_files,
        )
        names = [name for name, canary in CANARIES.items() if canary.applies(self.world_size)]
        self.canaries |= measure_canaries(names, phase, machine, self.layout.is_main)

    def _summarise_ranks(self) -> None:
        """Gather every rank's final weights digest and time split (the per-rank evidence of the record)."""
        counters = self.counters
        mine = {
            "rank": self.layout.rank,
            "host": socket.gethostname(),
            "weights_sha256": self._weights_digest(),
            "data_loading_s": counters.data_loading_s,
            "compute_s": counters.compute_s,
            "communication_s": counters.communication_s,
            "device_memory_peak_bytes": self._device_memory_peak_bytes(),
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

    def prepare(self) -> None:
        """Everything before MLPerf run_start: batch sizes and learning rate at this world size, then
        the framework's set-up (data, model, optimizer), logged between init_start and init_stop."""
        check_world_size(self.layout, self.trial["processes"])
        self.global_batch, self.local_batch = batch_sizes(self.training, self.world_size)
        self.learning_rate = scaled_lr(self.training, self.global_batch)
        self.mllog.init_start()
        self.mllog.header()
        clear_caches = self.spec["mlperf"]["clear_caches"]
        if clear_caches and self.layout.local_rank == 0:
            drop_page_cache()
        self.mllog.cache_clear(clear_caches)
        self._setup()
        self.mllog.hyperparameters(self.steps_per_epoch, self.split_sizes)
        self.mllog.init_stop()

    def run(self) -> dict:
        """Prepare, then train until the target is met or ``epochs_max``; the record's metrics."""
        training, target, counters = self.training, self.benchmark["target"], self.counters
        self.prepare()
        self.measure_canaries(BEFORE_TIMED)
        self.mllog.run_start()
        self.measurements.begin("timed_training")
        run_start = self._now()
        epoch = 0
        for epoch in range(1, training["epochs_max"] + 1):
            self.mllog.epoch_start(epoch)
            loop_start = self._now()
            self._train_epoch(epoch)
            counters.train_loop_s += self._now() - loop_start
            counters.epochs_run = epoch
            self.mllog.epoch_stop(epoch)
            if epoch % training["eval_every"] and epoch != training["epochs_max"]:
                continue
            self.mllog.eval_start(epoch)
            eval_start = self._now()
            values = self._evaluate()
            counters.eval_s += self._now() - eval_start
            counters.samples_evaluated += self.split_sizes["val"]
            quality = values[target["metric"]]
            if not math.isfinite(quality):  # a model whose outputs are NaN or infinite
                raise TrainingDiverged(f"{target['metric']} is {quality} at the evaluation after epoch {epoch}")
            counters.quality_history.append({"epoch": epoch, "value": quality})
            self.mllog.quality(quality, epoch)
            self.mllog.eval_stop(epoch)
            if _met(quality, target):
                counters.epochs_to_target = epoch
                break
        counters.time_to_train_s = self._now() - run_start
        self.measurements.end("timed_training")
        self.mllog.run_stop(counters.epochs_to_target is not None, epoch)
        self.metrics = trial_metrics(counters)
        self._summarise_ranks()
        return self.metrics

    def _now(self) -> float:
        return time.perf_counter()


def measure_process_roof(spec: dict, layout: ProcessLayout) -> MatmulPeak:
    """This trial process's roof (mlcampaign.measure.roofline): its device, its share of the node's cores as
    intra-op threads, and the trial's precision."""
    trial = spec["trial"]
    torch.set_num_threads(threads_per_process(spec["system"], trial["tasks_per_node"]))
    dtype = getattr(torch, PRECISIONS[trial["precision"]].torch_dtype)
    return measure_matmul_peak(torch_device(spec["system"]["device"], layout), dtype)


TRIAL_CLASSES = {
    "torch": "mlcampaign.trial.torch.trial:TorchTrial",
    "tensorflow": "mlcampaign.trial.keras.trial:KerasTrial",
}


def trial_class(framework: str) -> type[TrialRun]:
    """The TrialRun implementation of a framework (imported only when used)."""
    module, name = TRIAL_CLASSES[framework].split(":")
    return getattr(importlib.import_module(module), name)


def run_trial(
    spec: dict,
    dataset_id_path: Path,
    record_path: Path,
    mllog_path: Path,
    deadline: Deadline = NO_DEADLINE,
) -> dict:
    """Run this process's part of a trial; rank 0 writes the record (a failure record if training fails).

    ``dataset_id_path`` is the staged dataset's id file (its data and manifest beside it). Training
    stops with the reason ``timeout`` once ``deadline`` has passed (checked after every step). A
    trial that fails keeps what it measured until then (finished epochs and evaluations, throughput
    over its measured steps). Returns the record (on every rank).
    """
    started = utc_now()
    layout = detect_layout()
    trial = trial_class(spec["trial"]["framework"])(spec, layout, dataset_id_path, mllog_path)
    trial.deadline = deadline
    peak = peak_after = dataset_id = failure = None
    trial.measurements.start()
    try:
        dataset_id = read_dataset_id(dataset_id_path)
        peak = measure_process_roof(spec, layout)  # about 0.25 s, before training
        trial.measure_canaries(BEFORE_SETUP, peak)
        metrics = trial.run()
        # Again after training: a roof that fell while the trial trained says another process took the cores.
        peak_after = measure_process_roof(spec, layout)
        trial.measure_canaries(AFTER_TIMED)
    except (Exception, torch.OutOfMemoryError) as exc:  # every failure becomes a record with its reason
        traceback.print_exc()
        # What the trial measured before it failed; nothing at all if it never trained a step.
        metrics = trial.metrics or (trial_metrics(trial.counters) if trial.counters.steps else empty_trial_metrics())
        # Past the deadline, a rank's failure is the timeout (another rank may have stopped first).
        reason = "timeout" if deadline.passed() else classify_failure(exc)
        failure = {"reason": reason, "message": f"{type(exc).__name__}: {exc}"}
    finally:
        trial.measurements.stop()
        trial.close(failure["message"] if failure else None)
    distributed = trial.distributed or trial.distributed_block([])
    measured = {
        "energy": trial.measurements.energy_block(metrics["samples_trained"]),
        "contention": trial.measurements.contention_block(
            peak.flops_per_s if peak else None, peak_after.flops_per_s if peak_after else None
        ),
        "software": software_stack(),
        "compile_cache_dir": trial.compile_cache_dir,
        "canaries": trial.canaries,
    }
    record = build_record(
        spec, dataset_id, trial.split_sizes, metrics, trial.flop_count, failure, started, distributed, peak, measured
    )
    if layout.is_main:
        write_record(record, record_path, sys.stderr)
    elif failure is not None and not await_main_record(Path(record_path)):
        print(f"rank 0 wrote no record within {MAIN_RECORD_WAIT_S:.0f} s of this rank's failure", file=sys.stderr)
    return record
