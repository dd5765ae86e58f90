"""Synthetic, schema-valid trial records: test data for the analysis and its 100 000-record benchmark.

The numbers are random draws shaped like real records (throughput grows with processes at a set
efficiency, quality around the target, FLOPs consistent with throughput); they describe no
machine and must never be mixed with measured results. Each record passes
mlcampaign.records.files.validate_record.
"""

from __future__ import annotations

import copy
import datetime

import numpy as np

from mlcampaign.plan.campaign import Scale, cell_id
from mlcampaign.plan.metrics import COMPARABLE_METRICS
from mlcampaign.records.files import SCHEMA_VERSION

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


# -- a campaign's weekly runs at several sites (the history's tests and its benchmarks) --------------

HISTORY_CAMPAIGN_CONFIG = {
    "campaign": "synthetic",
    "seed": 7,
    "analysis": {"confidence": 0.95, "bootstrap_resamples": 1000},
    "regression": {
        "baseline_dir": "baselines",
        "metrics": list(COMPARABLE_METRICS),
        "target_change": 0.05,
        "false_alarm_rate": 0.01,
        "window": 12,
        "confirmation": 3,
        "keep_contended": False,
    },
}


def synthetic_history(
    sites: dict[str, list[str]],
    benchmarks: list[str],
    cells: list[tuple[str, str]],
    weeks: int,
    *,
    trials: tuple[int, int] = (3, 5),
    slowdowns: dict[str, tuple[int, float]] | None = None,
    failure_rate: float = 0.0,
    seed: int = 0,
    campaign_config: dict | None = None,
) -> tuple[list[dict], list[dict]]:
    """Run manifests and records (with ``run.id``) of one synthetic campaign: each site runs its
    systems' trials once a week; every manifest plans every system's trials (``at_site`` says
    which). ``cells``: (scale, precision) pairs; ``trials``: fewest and most seeded trials per cell
    (drawn once per cell); ``slowdowns``: system -> (first slow week, throughput factor), with a
    torch version change in that system's records from that week on."""
    rng = np.random.default_rng(seed)
    systems = [system for site_systems in sites.values() for system in site_systems]
    plan = [
        plan_row(system, benchmark, scale, precision, trial)
        for system in systems
        for benchmark in benchmarks
        for scale, precision in cells
        for trial in range(int(rng.integers(trials[0], trials[1] + 1)))
    ]
    base_throughput = {system: 100.0 + 40 * position for position, system in enumerate(systems)}
    start = datetime.datetime(2026, 1, 5, 6, tzinfo=datetime.UTC)
    manifests, records = [], []
    for week in range(weeks):
        for site_position, (site, site_systems) in enumerate(sites.items()):
            run_id = f"{site}-2026w{week + 1:02d}"
            started = start + datetime.timedelta(weeks=week, hours=site_position)
            manifests.append(
                {
                    "run_id": run_id,
                    "campaign": "synthetic",
                    "site": site,
                    "started_utc": started.isoformat(),
                    "campaign_config": copy.deepcopy(campaign_config or HISTORY_CAMPAIGN_CONFIG),
                    "systems": {system: {"site": site, "launcher": "local"} for system in systems},
                    "benchmarks": {benchmark: benchmark_config() for benchmark in benchmarks},
                    "plan": [row | {"at_site": row["system"] in site_systems} for row in plan],
                    "unplanned": [],
                    "workflow_commit": f"{week // 8:040x}",
                }
            )
            for position, row in enumerate(row for row in plan if row["system"] in site_systems):
                first_slow_week, factor = (slowdowns or {}).get(row["system"], (weeks, 1.0))
                slow = week >= first_slow_week
                failure = "out_of_memory" if rng.random() < failure_rate else None
                throughput = base_throughput[row["system"]] * (factor if slow else 1.0)
                drawn = record(row, rng, base_throughput=throughput, failure_reason=failure)
                finished = started + datetime.timedelta(minutes=position + 1)
                drawn["provenance"] |= {
                    "started_utc": (finished - datetime.timedelta(minutes=1)).isoformat(),
                    "finished_utc": finished.isoformat(),
                    "scheduler_job_id": f"{run_id}.{position}",
                    "packages": {"torch": "2.15.0" if slow else "2.14.1", "numpy": "2.4.6"},
                }
                drawn["trial"]["campaign"] = "synthetic"
                drawn["run"] = {"id": run_id, "site": site}
                records.append(drawn)
    return manifests, records


# -- the machine's canaries in records (mlcampaign.plan.canaries) ---------------------------------------------

CANARY_LEVELS = {
    "memory_triad_bytes_per_s": 2.0e10,
    "allreduce_bus_bytes_per_s": 5.0e9,
    "dataset_read_bytes_per_s": 1e9,
}


def add_canaries(
    records: list[dict],
    *,
    seed: int = 0,
    cv: float = 0.02,
    runs: set[str] | None = None,
    machine_shifts: dict[str, tuple[str, float]] | None = None,
) -> list[dict]:
    """``records`` with a canaries block drawn around CANARY_LEVELS (the matmul canary around the process's peak
    at its precision; the all-reduce only for more than one process), lognormal with ``cv``; only in the records
    of ``runs`` (default: all), the others left as records written before canaries existed.
    ``machine_shifts``: system -> (first run id, factor): every canary of that system's records from that run on
    (run ids compare as text, as the synthetic weeks do) scaled by ``factor``."""
    rng = np.random.default_rng(seed)
    for drawn in records:
        run_id, trial = drawn["run"]["id"], drawn["trial"]
        if runs is not None and run_id not in runs:
            continue
        first, factor = (machine_shifts or {}).get(trial["system"], (None, 1.0))
        scale = factor if first is not None and run_id.rsplit("-", 1)[-1] >= first.rsplit("-", 1)[-1] else 1.0
        levels = {"matmul_flops_per_s": PEAK_FLOPS_PER_PROCESS[trial["precision"]]} | CANARY_LEVELS
        units = {"matmul_flops_per_s": "FLOP/s"}
        drawn["canaries"] = {
            name: {
                "value": level * scale * float(rng.lognormal(0, cv)),
                "unit": units.get(name, "B/s"),
                "repeats": 5,
                "repeat_cv": cv,
                "method": "synthetic",
            }
            for name, level in levels.items()
            if name != "allreduce_bus_bytes_per_s" or trial["processes"] > 1
        }
    return records
