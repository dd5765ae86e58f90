"""Synthetic, schema-valid trial records: test data for the analysis and its 100 000-record benchmark.

The numbers are random draws shaped like real records (throughput grows with processes at a set
efficiency, quality around the target, FLOPs consistent with throughput); they describe no
machine and must never be mixed with measured results. Each record passes
mlcampaign.record.validate_record.
"""

from __future__ import annotations

import numpy as np

from mlcampaign.config import Scale, cell_id
from mlcampaign.record import SCHEMA_VERSION

TRAIN_FLOPS_PER_SAMPLE = 1.2e8
FORWARD_FLOPS_PER_SAMPLE = TRAIN_FLOPS_PER_SAMPLE / 3
PEAK_FLOPS_PER_PROCESS = {"fp32": 1.0e11, "bf16": 2.0e11, "fp16": 2.0e11}


def plan_row(
    system: str,
    benchmark: str,
    scale: str,
    precision: str,
    trial: int,
    replicate: int = 0,
    *,
    compression: str = "none",
    framework: str = "torch",
    backend: str = "native",
) -> dict:
    """A row of the planned trial matrix (as Campaign.trial_matrix() has it)."""
    layout = Scale.parse(scale)
    return {
        "system": system,
        "benchmark": benchmark,
        "cell": cell_id(layout, precision, compression, framework, backend),
        "trial": trial,
        "replicate": replicate,
        "nodes": layout.nodes,
        "tasks_per_node": layout.tasks_per_node,
        "processes": layout.processes,
        "precision": precision,
        "compression": compression,
        "framework": framework,
        "backend": backend,
        "seed": 1000 + trial,
        "executor": "local",
    }


def record(
    row: dict,
    rng: np.random.Generator,
    *,
    base_throughput: float = 250.0,
    efficiency: float = 0.9,
    batch_scaling: str = "strong",
    batch_size: int = 32,
    target: float = 0.9,
    failure_reason: str | None = None,
) -> dict:
    """A record for planned trial ``row``; a failure record when ``failure_reason`` is given.

    ``batch_size`` is the global batch for strong scaling and the per-process batch for weak.
    """
    processes = row["processes"]
    global_batch = batch_size if batch_scaling == "strong" else batch_size * processes
    throughput = base_throughput * processes ** np.log2(2 * efficiency) * rng.lognormal(0, 0.05)
    epochs = int(rng.integers(3, 7))
    samples_trained = epochs * 1400
    samples_evaluated = epochs * 360
    quality = float(np.clip(target + rng.normal(0.01, 0.02), 0, 1))
    reached = quality >= target
    train_loop = samples_trained / throughput
    io_share = rng.uniform(0.02, 0.1)
    communication = 0.0 if processes == 1 else train_loop * rng.uniform(0.05, 0.2)
    metrics = {
        "reached_target": reached,
        "achieved_quality": quality,
        "epochs_to_target": epochs if reached else None,
        "epochs_run": epochs,
        "time_to_train_s": train_loop * 1.1,
        "throughput_samples_per_s": throughput,
        "warmup_steps_excluded": 5,
        "samples_trained": samples_trained,
        "samples_evaluated": samples_evaluated,
        "train_loop_s": train_loop,
        "eval_s": train_loop * 0.1,
        "data_loading_s": train_loop * io_share,
        "compute_s": train_loop * (1 - io_share) - communication,
        "communication_s": communication,
        "allreduce_in_flight_s": communication * 2,
        "communication_method": "synthetic",
        "staging_s": 0.5,
        "quality_history": [{"epoch": epochs, "value": quality}],
    }
    peak = PEAK_FLOPS_PER_PROCESS[row["precision"]] * processes
    achieved = TRAIN_FLOPS_PER_SAMPLE * throughput
    flops = {
        "train_per_sample": TRAIN_FLOPS_PER_SAMPLE,
        "forward_per_sample": FORWARD_FLOPS_PER_SAMPLE,
        "total": TRAIN_FLOPS_PER_SAMPLE * samples_trained + FORWARD_FLOPS_PER_SAMPLE * samples_evaluated,
        "achieved_flops_per_s": achieved,
        "fraction_of_peak": achieved / peak,
        "method": "synthetic",
    }
    failure = None
    if failure_reason is not None:
        failure = {"reason": failure_reason, "message": f"synthetic {failure_reason}"}
        metrics = dict.fromkeys(metrics) | {"quality_history": [], "communication_method": None}
        flops = dict.fromkeys(flops) | {"method": "synthetic"}
    return {
        "schema_version": SCHEMA_VERSION,
        "status": "failed" if failure else "ok",
        "failure": failure,
        "trial": {key: value for key, value in row.items() if key != "executor"}
        | {"campaign": "synthetic", "deterministic": False},
        "system": {"accelerator": "synthetic", "device": "cpu", "devices_used": processes, "peak_flops_per_s": peak},
        "benchmark": {
            "model": "resnet50",
            "target_metric": "top1",
            "target_direction": "higher",
            "target_value": target,
            "global_batch_size": global_batch,
            "local_batch_size": global_batch // processes,
            "batch_scaling": batch_scaling,
            "learning_rate": 0.05,
            "lr_scaling": "none",
            "channels_last": False,
        },
        "dataset": {"name": "synthetic", "dataset_id": "0" * 16, "train_samples": 1400, "eval_samples": 360},
        "metrics": metrics,
        "flops": flops,
        "distributed": {
            "world_size": processes,
            "launcher": "synthetic",
            "rank_environment": "synthetic",
            "communication": "synthetic",
            "ranks": [],
            "weights_consistent": None,
        },
        "provenance": {
            "hostname": "synthetic",
            "platform": "synthetic",
            "cpu_model": "synthetic",
            "gpu_model": None,
            "python": "3.11",
            "packages": {},
            "workflow_commit": None,
            "workflow_dirty": None,
            "command_line": [],
            "started_utc": "2026-01-01T00:00:00+00:00",
            "finished_utc": "2026-01-01T00:01:00+00:00",
            "scheduler_job_id": None,
            "environment": {},
        },
    }


def benchmark_config(exponent: float = 10, cap: float = 1.0) -> dict:
    """The part of a benchmark config the analysis reads."""
    return {"valid_flops": {"exponent": exponent, "cap": cap, "source": "synthetic"}}
