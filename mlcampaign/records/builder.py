"""Building a trial's record (mlcampaign/plan/schemas/record.schema.yaml) from what any framework's trial measured.

No torch here: the trial job's supervisor (mlcampaign.job.supervisor) writes failure records with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from mlcampaign.plan.campaign import compile_setting
from mlcampaign.plan.canaries import CANARIES
from mlcampaign.plan.hyperparameters import batch_sizes, scaled_lr
from mlcampaign.plan.metrics import empty_trial_metrics, work_flops
from mlcampaign.plan.runs import utc_now
from mlcampaign.records.files import SCHEMA_VERSION
from mlcampaign.records.provenance import provenance

if TYPE_CHECKING:
    from mlcampaign.measure.canaries.probe import CanaryReading
    from mlcampaign.measure.roofline import MatmulPeak


def devices_used(system: dict, trial: dict) -> int:
    """Devices a trial occupies: one per process on accelerators; whole nodes on CPU systems."""
    if system["device"] == "cpu":
        return trial["nodes"] * system["devices_per_node"]
    return trial["processes"]


def roofline_block(peak: MatmulPeak | None, processes: int, achieved_flops_per_s: float | None) -> dict:
    """The record's ``roofline`` block: the trial's measured peak (this process's x ``processes``, the
    ranks being alike) and the fraction of it that the training step achieved."""
    if peak is None:
        return {"peak_flops_per_s": None, "measured_with": None, "achieved_fraction": None}
    total = peak.flops_per_s * processes
    ranks = f" x {processes} processes (rank 0's measurement; ranks alike)" if processes > 1 else ""
    return {
        "peak_flops_per_s": total,
        "measured_with": peak.describe() + ranks,
        "achieved_fraction": achieved_flops_per_s / total if achieved_flops_per_s else None,
    }


def canaries_block(readings: Mapping[str, CanaryReading]) -> dict:
    """The record's ``canaries`` block: each canary measured (``readings``, by name) with its unit, in the order
    of the canaries table (mlcampaign.plan.canaries); those not measured are absent."""
    return {
        name: {
            "value": readings[name].value,
            "unit": canary.unit,
            "repeats": readings[name].repeats,
            "repeat_cv": readings[name].repeat_cv,
            "method": readings[name].method,
        }
        for name, canary in CANARIES.items()
        if name in readings
    }


# How far a measured matmul roof may exceed the system's nominal peak before the nominal figure is
# called wrong (clock boost and measurement noise stay inside it).
PEAK_TOLERANCE = 1.1
FLOP_METHODS = {
    "torch": "torch.utils.flop_counter (conv/matmul; multiply-add = 2 FLOPs)",
    "tensorflow": "tf.profiler float_operation on the Keras model's graphs (conv/matmul; multiply-add = 2 FLOPs)",
}


# The trial's coordinates and settings the record keeps (its ``trial`` block, with the campaign's name and
# determinism).
TRIAL_FIELDS = (
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


def build_record(
    spec: dict,
    dataset_id: str,
    split_sizes: dict,
    metrics: dict,
    flop_count,
    failure: dict | None,
    started: str,
    distributed: dict | None = None,
    roofline_peak: MatmulPeak | None = None,
    measured: dict | None = None,
) -> dict:
    """The trial record (mlcampaign/plan/schemas/record.schema.yaml) of any framework.

    ``dataset_id``: the staged dataset's id (its id file's content); ``distributed`` is the gathered
    per-rank block; a trial that failed before gathering gets one with null values and no ranks.
    ``roofline_peak``: rank 0's measured matmul peak (none when the trial failed before measuring
    it). ``measured``: the ``energy`` and ``contention`` blocks, the ``software`` stack
    (mlcampaign.measure.instruments) and the ``canaries`` readings (mlcampaign.measure.canaries); none for a
    record written without the trial (a failed launch), whose canaries block is empty.

    The peak that ``fraction_of_peak`` divides by is the system's nominal peak where it has one, else
    the measured roof (``system.peak_basis`` says which); a measured roof above the nominal peak by
    more than PEAK_TOLERANCE flags the system file (``system.nominal_peak_exceeded``).
    """
    trial, system, benchmark = spec["trial"], spec["system"], spec["benchmark"]
    measured = measured or {}
    system_block = _system_block(system, trial, roofline_peak)
    flops = _flops_block(flop_count, metrics, system_block["peak_flops_per_s"], trial["framework"])
    return {
        "schema_version": SCHEMA_VERSION,
        "run": spec["run"],
        "status": "failed" if failure else "ok",
        "failure": failure,
        "trial": {key: trial[key] for key in TRIAL_FIELDS}
        | {"campaign": spec["campaign"], "deterministic": spec["deterministic"]},
        "system": system_block,
        "benchmark": _benchmark_block(benchmark, trial, measured),
        "dataset": {
            "name": benchmark["dataset"]["name"],
            "dataset_id": dataset_id,
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
        "energy": measured.get("energy"),
        "contention": measured.get("contention"),
        "canaries": canaries_block(measured.get("canaries", {})),
        "provenance": provenance(started) | {"software": measured.get("software")},
    }


def _system_block(system: dict, trial: dict, roofline_peak: MatmulPeak | None) -> dict:
    """The record's ``system``: the devices the trial used and the peak its fraction of peak divides by."""
    n_devices = devices_used(system, trial)
    peak_per_device = system["peak_flops_per_device"].get(trial["precision"])
    roof = roofline_block(roofline_peak, trial["processes"], None)["peak_flops_per_s"]
    peak = peak_per_device * n_devices if peak_per_device else roof
    exceeded = peak_per_device is not None and roof is not None and roof > PEAK_TOLERANCE * peak
    return {
        "accelerator": system["accelerator"],
        "device": system["device"],
        "devices_used": n_devices,
        "peak_flops_per_s": peak,
        "peak_basis": "nominal" if peak_per_device else "measured",
        "peak_source": system.get("peak_source") if peak_per_device else "the trial's measured matmul roof",
        "nominal_peak_exceeded": exceeded if peak_per_device and roof is not None else None,
    }


def _flops_block(flop_count, metrics: dict, peak: float | None, framework: str) -> dict:
    """The record's ``flops``: counted FLOPs per sample, of the whole trial, achieved and as a fraction of ``peak``."""
    flops = dict.fromkeys(
        ("train_per_sample", "forward_per_sample", "total", "achieved_flops_per_s", "fraction_of_peak")
    )
    if flop_count is not None:
        flops["train_per_sample"] = flop_count.train_per_sample
        flops["forward_per_sample"] = flop_count.forward_per_sample
        if metrics["samples_trained"] is not None:
            flops["total"] = work_flops(
                flop_count.train_per_sample,
                flop_count.forward_per_sample,
                metrics["samples_trained"],
                metrics["samples_evaluated"],
            )
        if metrics["throughput_samples_per_s"]:
            flops["achieved_flops_per_s"] = flop_count.train_per_sample * metrics["throughput_samples_per_s"]
            flops["fraction_of_peak"] = flops["achieved_flops_per_s"] / peak if peak else None
    flops["method"] = FLOP_METHODS[framework]
    return flops


def _benchmark_block(benchmark: dict, trial: dict, measured: dict) -> dict:
    """The record's ``benchmark``: the model, its quality target and the training settings at the trial's scale."""
    training = benchmark["training"]
    global_batch, local_batch = batch_sizes(training, trial["processes"])
    return {
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
        "compile": _compile_block(training, measured),
    }


def _compile_block(training: dict, measured: dict) -> dict | None:
    """The record's ``benchmark.compile``: the torch.compile backend and mode, and the compile cache the trial
    used (``measured``; unknown for a record written without the trial); None for an eager benchmark."""
    setting = compile_setting(training)
    if setting is None:
        return None
    return {"backend": setting["backend"], "mode": setting["mode"], "cache_dir": measured.get("compile_cache_dir")}


def launch_failure_record(spec: dict, dataset_id: str, status: int, reason: str, explanation: str) -> dict:
    """The record of a trial whose launch exited with ``status`` before rank 0 wrote one: ``reason``
    (mlcampaign.plan.registry.FAILURE_REASONS) and ``explanation`` say what happened."""
    failure = {
        "reason": reason,
        "message": f"the launcher exited with status {status} before rank 0 wrote a record ({explanation})",
    }
    return build_record(spec, dataset_id, {}, empty_trial_metrics(), None, failure, utc_now())
