"""Every metric of a trial, declared once: its name, unit, which way is better, what it is, where it comes from.

One ``Metric`` per quantity a table shows about a trial. ``record`` says where a trial's value is
read from its record (``metrics.<key>`` for what the trial loop measures, or another block, e.g.
``flops.total``); ``None`` marks a quantity the analysis derives per trial from others
(mlcampaign.analysis.frame). Readers of this table:

- the record schema: its ``metrics`` block is generated from the ``metrics.*`` entries
  (``x-metrics`` in mlcampaign/plan/schemas/record.schema.yaml; mlcampaign.plan.config_files);
- the trial: ``trial_metrics`` turns the trial loop's counters into the record's ``metrics`` block,
  each entry through its ``measure`` (or the counter of the same name);
- the analysis: the columns of the planned_trials table (mlcampaign.analysis.frame), and the
  metrics summarised per cell and compared against baselines (``COMPARABLE_METRICS``, with their
  better direction).

Adding a metric is one entry here plus its measurement (a counter of ``TrialCounters`` that the
trial loop fills, or a ``measure`` function of the existing ones). The module is long because the
table is: one entry per metric, and the functions that turn a trial's counts into its values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np


@dataclasses.dataclass
class TrialCounters:
    """What a trial's loop counts (mlcampaign.trial.protocol.TrialRun); the trial metrics are functions of it.

    Step times and sample counts named ``measured_*`` and the time split cover the steps after the
    first ``warmup_steps`` (the declared warm-up); ``steps`` and ``samples_trained`` count all.
    """

    warmup_steps: int = 0
    steps: int = 0
    samples_trained: int = 0
    measured_steps: int = 0
    measured_samples: int = 0
    samples_evaluated: int = 0
    data_loading_s: float = 0.0
    compute_s: float = 0.0
    communication_s: float = 0.0
    allreduce_in_flight_s: float = 0.0
    train_loop_s: float = 0.0
    eval_s: float = 0.0
    epochs_run: int | None = None
    epochs_to_target: int | None = None
    quality_history: list[dict] = dataclasses.field(default_factory=list)
    time_to_train_s: float | None = None
    staging_s: float | None = None
    compile_s: float | None = None
    communication_method: str | None = None


@dataclasses.dataclass(frozen=True)
class Metric:
    name: str  # column of the analysis tables
    unit: str  # "" for flags and text; "target metric" for the benchmark's quality metric
    better: str | None  # "higher", "lower", "target" (the benchmark's target direction) or None
    description: str
    record: str | None  # dotted path in the record; None: derived by the analysis
    kind: str = "number"  # JSON type of the value: number, integer, boolean, string, history
    required: bool = True  # every record has it (False: absent in records older than the metric)
    tabled: bool = False  # a column of the planned_trials table (record metrics; derived ones always are)
    measure: Callable[[TrialCounters], Any] | None = None  # trial metrics; None: the counter of the same key


def _throughput(counters: TrialCounters) -> float | None:
    step_time = counters.data_loading_s + counters.compute_s + counters.communication_s
    return counters.measured_samples / step_time if counters.measured_steps else None


def _achieved_quality(counters: TrialCounters) -> float | None:
    return counters.quality_history[-1]["value"] if counters.quality_history else None


# The values a quantity of each unit can take in a record (a schema's ``x-unit``: the record schema's
# numbers and the metrics below; mlcampaign.plan.config_files). Below the minimum or above the maximum
# a value is no measurement (a negative time, a clock or counter gone wrong), and would rank first or
# last in every table: the record is refused, naming the key. The maxima are far beyond any machine:
# three years, a zettaFLOP/s, 10^30 FLOPs (a zettaFLOP/s machine for 30 years), a gigawatt, a petabyte
# of device memory, an exabyte per second.
UNIT_BOUNDS = {
    "s": (0, 1e8),
    "samples": (0, 1e15),
    "samples/s": (0, 1e12),
    "epochs": (0, 1e6),
    "steps": (0, 1e15),
    "FLOP": (0, 1e30),
    "FLOP/s": (0, 1e21),
    "J": (0, 1e15),
    "W": (0, 1e9),
    "samples/J": (0, 1e12),
    "bytes": (0, 1e15),
    "B/s": (0, 1e18),
    "%": (0, 100),
    "count": (0, 1e15),
    "1/s": (0, 1e12),
    "fraction": (0, 1e6),
}
_SECONDS_AFTER_WARMUP = "(steps after the warm-up)"
METRICS = {
    metric.name: metric
    for metric in (
        # -- measured by the trial loop (record.metrics) ------------------------------------------
        Metric(
            "reached_target",
            "",
            None,
            "an evaluation met the benchmark's quality target",
            "metrics.reached_target",
            kind="boolean",
            measure=lambda c: c.epochs_to_target is not None,
            tabled=True,
        ),
        Metric(
            "achieved_quality",
            "target metric",
            "target",
            "last evaluated value of the target metric",
            "metrics.achieved_quality",
            measure=_achieved_quality,
            tabled=True,
        ),
        Metric(
            "epochs_to_target",
            "epochs",
            "lower",
            "epochs until the target was met",
            "metrics.epochs_to_target",
            kind="integer",
            tabled=True,
        ),
        Metric("epochs_run", "epochs", None, "epochs trained", "metrics.epochs_run", kind="integer", tabled=True),
        Metric(
            "run_time_s",
            "s",
            None,
            "run_start to run_stop (MLPerf), evaluation included, whether or not the target was met",
            "metrics.time_to_train_s",
            tabled=True,
        ),
        Metric(
            "throughput_samples_per_s",
            "samples/s",
            "higher",
            "training throughput (samples/s) after the warm-up steps",
            "metrics.throughput_samples_per_s",
            measure=_throughput,
            tabled=True,
        ),
        Metric(
            "warmup_steps_excluded",
            "steps",
            None,
            "training steps left out of the throughput and the time split (the declared warm-up)",
            "metrics.warmup_steps_excluded",
            kind="integer",
            measure=lambda c: min(c.warmup_steps, c.steps),
        ),
        Metric(
            "samples_trained",
            "samples",
            None,
            "training samples over all steps",
            "metrics.samples_trained",
            kind="integer",
            tabled=True,
        ),
        Metric(
            "samples_evaluated",
            "samples",
            None,
            "validation samples over all evaluations",
            "metrics.samples_evaluated",
            kind="integer",
            tabled=True,
        ),
        Metric("train_loop_s", "s", None, "wall time of the training epochs", "metrics.train_loop_s"),
        Metric("eval_s", "s", None, "wall time of the evaluations", "metrics.eval_s"),
        Metric(
            "data_loading_s",
            "s",
            None,
            f"waiting for the next batch {_SECONDS_AFTER_WARMUP}",
            "metrics.data_loading_s",
            tabled=True,
        ),
        Metric(
            "compute_s",
            "s",
            None,
            f"forward, backward and optimizer step: step time minus data loading and communication_s "
            f"{_SECONDS_AFTER_WARMUP}",
            "metrics.compute_s",
            tabled=True,
        ),
        Metric(
            "communication_s",
            "s",
            None,
            "gradient all-reduce not hidden by compute (see communication_method); 0 for one process",
            "metrics.communication_s",
            tabled=True,
        ),
        Metric(
            "allreduce_in_flight_s",
            "s",
            None,
            f"wall time with at least one gradient all-reduce in flight, hidden or not {_SECONDS_AFTER_WARMUP}",
            "metrics.allreduce_in_flight_s",
        ),
        Metric(
            "communication_method",
            "",
            None,
            "how communication_s and allreduce_in_flight_s were measured",
            "metrics.communication_method",
            kind="string",
        ),
        Metric(
            "staging_s",
            "s",
            None,
            "MLPerf staging_start to staging_stop: verified copy to the system's staging_dir, or verification "
            "in place (before run_start); hashed once per node and run, later trials of the run check the files' "
            "metadata (mlcampaign.data.staging)",
            "metrics.staging_s",
            required=False,
        ),
        Metric(
            "compile_s",
            "s",
            None,
            "torch.compile of the training step (training.compile), timed apart in MLPerf init before run_start "
            "(model initialization, outside time to train), on synthetic inputs: cold, or a warm compile cache's "
            "hits; null for eager trials",
            "metrics.compile_s",
            required=False,
        ),
        Metric(
            "quality_history",
            "target metric",
            None,
            "every evaluation's epoch and value of the target metric",
            "metrics.quality_history",
            kind="history",
            required=False,
        ),
        # -- other blocks of the record -------------------------------------------------------------
        Metric(
            "train_set_samples",
            "samples",
            None,
            "samples in the staged training split (one nominal epoch)",
            "dataset.train_samples",
            kind="integer",
            tabled=True,
        ),
        Metric(
            "train_flops_per_sample",
            "FLOP",
            None,
            "counted FLOPs of one training step per sample (forward + backward)",
            "flops.train_per_sample",
            tabled=True,
        ),
        Metric(
            "forward_flops_per_sample",
            "FLOP",
            None,
            "counted FLOPs of one forward pass per sample (evaluation)",
            "flops.forward_per_sample",
            tabled=True,
        ),
        Metric(
            "flops_total",
            "FLOP",
            None,
            "counted FLOPs of the trial: train_per_sample x samples_trained + forward_per_sample x samples_evaluated",
            "flops.total",
            tabled=True,
        ),
        Metric(
            "achieved_flops_per_s",
            "FLOP/s",
            "higher",
            "counted training FLOPs per sample x throughput",
            "flops.achieved_flops_per_s",
            tabled=True,
        ),
        Metric(
            "fraction_of_peak",
            "",
            "higher",
            "achieved FLOP/s over the configured peak of the devices used at the trial's precision",
            "flops.fraction_of_peak",
            tabled=True,
        ),
        Metric(
            "roofline_fraction",
            "",
            "higher",
            "achieved FLOP/s over the matmul peak the trial measured (mlcampaign.measure.roofline)",
            "roofline.achieved_fraction",
            tabled=True,
        ),
        Metric(
            "peak_basis",
            "",
            None,
            "which peak fraction_of_peak divides by: the system's nominal peak, or the measured matmul roof",
            "system.peak_basis",
            kind="string",
            required=False,
            tabled=True,
        ),
        Metric(
            "nominal_peak_exceeded",
            "",
            None,
            "the measured matmul roof exceeded the system's nominal peak by more than 10 %: the system file is wrong",
            "system.nominal_peak_exceeded",
            kind="boolean",
            required=False,
            tabled=True,
        ),
        Metric(
            "energy_to_train_j",
            "J",
            "lower",
            "energy of the node of rank 0 over the timed training (MLPerf run_start to run_stop)",
            "energy.energy_to_train_j",
            required=False,
            tabled=True,
        ),
        Metric(
            "mean_power_w",
            "W",
            None,
            "mean power of the node of rank 0 over the timed training",
            "energy.mean_power_w",
            required=False,
            tabled=True,
        ),
        Metric(
            "peak_power_w",
            "W",
            None,
            "peak power of the node of rank 0 over the timed training",
            "energy.peak_power_w",
            required=False,
            tabled=True,
        ),
        Metric(
            "samples_per_joule",
            "samples/J",
            "higher",
            "samples trained per joule of the timed training",
            "energy.samples_per_joule",
            required=False,
            tabled=True,
        ),
        Metric(
            "energy_not_measured",
            "",
            None,
            "why the energy was not measured (empty where it was)",
            "energy.not_measured",
            kind="string",
            required=False,
            tabled=True,
        ),
        Metric(
            "contended",
            "",
            None,
            "the timed training shared the machine: CPU steal, other processes' CPU time, context switches "
            "or a matmul roof that fell (mlcampaign.measure.contention)",
            "contention.contended",
            kind="boolean",
            required=False,
            tabled=True,
        ),
        # -- derived per trial by the analysis ----------------------------------------------------
        Metric(
            "time_to_train_s",
            "s",
            "lower",
            "time to train (s), trials that reached the target",
            None,
        ),
        Metric(
            "time_per_sample_s",
            "s",
            "lower",
            "time to train per training sample (s): time_to_train_s / samples_trained, the system's part of "
            "time to train (epochs_to_target is convergence's)",
            None,
        ),
        Metric(
            "flops_counting",
            "",
            None,
            "which FLOPs flops_counted counts: the benchmark's valid_flops.counting in words",
            None,
            kind="string",
        ),
        Metric(
            "flops_counted",
            "FLOP",
            None,
            "FLOPs of the trial under the flops_counting convention (mlcampaign.analysis.valid_flops.counted_flops)",
            None,
        ),
        Metric("flops_per_s", "FLOP/s", "higher", "flops_counted / run time (ok trials)", None),
        Metric(
            "penalty",
            "",
            None,
            "HPC AI500 quality penalty: (achieved / target)^exponent, capped once the target is met",
            None,
        ),
        Metric("valid_flops_per_s", "FLOP/s", "higher", "HPC AI500 Valid FLOPS (FLOP/s)", None),
        Metric(
            "valid_flops_per_watt",
            "FLOP/J",
            "higher",
            "Valid FLOPS per watt: valid_flops_per_s / mean_power_w",
            None,
        ),
        Metric("io_fraction", "", None, "share of the measured step time spent waiting for data", None),
        Metric("compute_fraction", "", None, "share of the measured step time spent computing", None),
        Metric(
            "communication_fraction",
            "",
            None,
            "share of the measured step time in communication not hidden by compute",
            None,
        ),
    )
}

# Metrics summarised per cell (repeatability) and judged over runs and against baselines
# (mlcampaign.analysis.detection), with their better direction.
COMPARABLE_METRICS = {
    name: METRICS[name].better
    for name in (
        "time_to_train_s",
        "time_per_sample_s",
        "throughput_samples_per_s",
        "achieved_quality",
        "epochs_to_target",
        "valid_flops_per_s",
    )
}
# Judged one-sided against the cell's history, as a convergence change (not a system change).
CONVERGENCE_METRICS = ("epochs_to_target",)
# Trended, not judged: the metric mixes causes that are judged apart.
SPLIT_METRICS = {"time_to_train_s": ("time_per_sample_s", "epochs_to_target")}

# The record's metrics block: its key (the record path's last part) -> the metric.
RECORD_METRICS = {
    metric.record.split(".", 1)[1]: metric
    for metric in METRICS.values()
    if metric.record and metric.record.startswith("metrics.")
}


def trial_metrics(counters: TrialCounters) -> dict:
    """The record's ``metrics`` block from a trial's counters."""
    return {
        key: metric.measure(counters) if metric.measure else getattr(counters, key)
        for key, metric in RECORD_METRICS.items()
    }


def empty_trial_metrics() -> dict:
    """The ``metrics`` block of a trial that measured nothing (it failed before training)."""
    return {key: [] if metric.kind == "history" else None for key, metric in RECORD_METRICS.items()}


def work_flops(train_per_sample, forward_per_sample, samples_trained, samples_evaluated):
    """FLOPs of training steps on ``samples_trained`` samples plus forward passes on ``samples_evaluated``
    (elementwise; a term with no samples adds nothing, even where its FLOPs per sample are unknown): the
    record's ``flops.total`` (flops_total), and the FLOPs that Valid FLOPS counts under a convention
    (mlcampaign.analysis.valid_flops)."""
    train = np.asarray(train_per_sample, dtype=float) * np.asarray(samples_trained, dtype=float)
    evaluated = np.asarray(samples_evaluated, dtype=float)
    with np.errstate(invalid="ignore"):
        forward = np.where(evaluated == 0, 0.0, np.asarray(forward_per_sample, dtype=float) * evaluated)
    flops = train + forward
    return flops if flops.ndim else float(flops)


_JSON_TYPES = {"number": "number", "integer": "integer", "boolean": "boolean", "string": "string"}


def record_metrics_schema() -> dict:
    """The JSON schema of the record's ``metrics`` block."""
    properties = {}
    for key, metric in RECORD_METRICS.items():
        annotations = {"description": metric.description, "x-unit": metric.unit}
        if metric.kind == "history":
            properties[key] = annotations | {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["epoch", "value"],
                    "properties": {"epoch": {"type": "integer", "x-unit": "epochs"}, "value": {"type": "number"}},
                },
            }
        else:
            properties[key] = annotations | {"type": [_JSON_TYPES[metric.kind], "null"]}
    return {
        "type": "object",
        "additionalProperties": False,
        "required": [key for key, metric in RECORD_METRICS.items() if metric.required],
        "properties": properties,
    }
