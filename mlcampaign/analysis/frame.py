"""The analysis view of a campaign: one row per planned trial, joined with its record if any.

Only the record fields the analysis needs are projected (``trial_frame``: the tabled metrics of
mlcampaign.plan.metrics, the canaries' values of mlcampaign.plan.canaries, each as column ``canary.<name>``, and
the fields of ``_RECORD_FIELDS``): flattening every field of 100 000 records
with ``pandas.json_normalize`` alone takes longer than the whole aggregation may. ``trials.csv``
(``flatten``) keeps every field.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

from mlcampaign.analysis.valid_flops import counted_flops, counting_label, counting_of, valid_flops_penalty
from mlcampaign.plan.campaign import TRIAL_KEYS
from mlcampaign.plan.canaries import CANARIES, canary_column
from mlcampaign.plan.metrics import METRICS

# The coordinates of one cell (what repeatability, ranking and scaling group by), and what the
# cell name encodes, as separate columns.
CELL_KEYS = ["system", "benchmark", "cell"]
CELL_COLUMNS = ["scale", "processes", "precision", "compression", "framework", "backend"]
# Status of a planned trial: its record's status, or NOT_RUN when no record exists.
NOT_RUN = "not run"

# What the analysis reads of a record besides its metrics: column -> path in the record.
_RECORD_FIELDS = {
    **{key: f"trial.{key}" for key in TRIAL_KEYS},
    "status": "status",
    "failure_reason": "failure.reason",
    "failure_message": "failure.message",
    "batch_scaling": "benchmark.batch_scaling",
    "global_batch_size": "benchmark.global_batch_size",
    "local_batch_size": "benchmark.local_batch_size",
    "target_metric": "benchmark.target_metric",
    "target_direction": "benchmark.target_direction",
    "target_value": "benchmark.target_value",
    "devices_used": "system.devices_used",
    "peak_flops_per_s": "system.peak_flops_per_s",
    "host": "provenance.hostname",
    # The matmul roof before and after the timed training: a contended trial's canary, if the two agree.
    "matmul_before_flops_per_s": "contention.matmul_peak_before_flops_per_s",
    "matmul_after_flops_per_s": "contention.matmul_peak_after_flops_per_s",
}
# The columns of a trial's record in the planned_trials table: those fields, the tabled metrics, the canaries.
RECORD_COLUMNS = {
    **_RECORD_FIELDS,
    **{m.name: m.record for m in METRICS.values() if m.tabled},
    **{canary_column(name): f"canaries.{name}.value" for name in CANARIES},
}
_TEXT_COLUMNS = {
    *CELL_KEYS,
    "status",
    "failure_reason",
    "failure_message",
    "batch_scaling",
    "target_metric",
    "target_direction",
    "host",
    *(name for name in RECORD_COLUMNS if name in METRICS and METRICS[name].kind == "string"),
}
_BOOLEAN_COLUMNS = {name for name in RECORD_COLUMNS if name in METRICS and METRICS[name].kind == "boolean"}


def _values(records: list[Mapping], path: str, blocks: dict[str, list[Mapping]]) -> list:
    """The value at ``path`` (dotted keys) of every record; None where a block is null or absent (a trial
    without failure, records written before the roofline or canaries block existed, a canary not measured).
    ``blocks``: each block of every record, looked up once for all its columns (100 000 records x 40 columns)."""
    block, _, key = path.partition(".")
    if not key:
        return [record.get(block) for record in records]
    if block not in blocks:
        blocks[block] = [record.get(block) or {} for record in records]
    values = blocks[block]
    *inner, last = key.split(".")
    for part in inner:
        values = [value.get(part) or {} for value in values]
    return [value.get(last) for value in values]


def trial_frame(records: Iterable[Mapping]) -> pd.DataFrame:
    """One row per (validated) record with the fields the analysis uses (``RECORD_COLUMNS``);
    ``run_time_s`` is the record's ``metrics.time_to_train_s`` (run start to stop, whether or not the
    target was met)."""
    records = list(records)
    data, blocks = {}, {}
    for name, path in RECORD_COLUMNS.items():
        values = _values(records, path, blocks)  # column by column: a row loop is slow for 100 000 records
        if name in _TEXT_COLUMNS:
            data[name] = pd.array(values, dtype="str")
        elif name in _BOOLEAN_COLUMNS:
            data[name] = pd.array(values, dtype="boolean")
        elif name in ("trial", "replicate"):
            data[name] = np.array(values, dtype=np.int64)
        else:  # numbers; None (not measured) becomes NaN
            data[name] = np.array(values, dtype=float)
    return pd.DataFrame(data, columns=list(RECORD_COLUMNS))


def planned_frame(plan: pd.DataFrame) -> pd.DataFrame:
    """The planned trial matrix (``Campaign.trial_matrix()``) with a readable scale label."""
    planned = plan.reset_index(drop=True)
    planned["scale"] = planned["nodes"].astype(str) + "x" + planned["tasks_per_node"].astype(str)
    return planned[[*TRIAL_KEYS, "seed", "nodes", "tasks_per_node", *CELL_COLUMNS]]


def campaign_frame(
    planned: pd.DataFrame,
    trials: pd.DataFrame,
    benchmarks: Mapping[str, Mapping],
    known_outcomes: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Every planned trial with its record's fields (NaN and status NOT_RUN where there is none).

    A trial without a (readable) record that ``known_outcomes`` lists (TRIAL_KEYS, ``failure_reason``,
    ``failure_message``: its job was killed by the scheduler, mlcampaign.job.slurm_accounting.killed_trials, or
    its record cannot be read)
    is failed with that reason instead.

    Records of trials that are not planned (left over from an earlier plan) are ignored. Adds the
    per-trial quantities the tables use:

    - ``valid``: the trial is ok and reached the quality target;
    - ``time_to_train_s``: run time of trials that reached the target, NaN otherwise (MLPerf counts
      converged runs only); ``time_per_sample_s``: that over the samples trained (the system's part of
      time to train; epochs to target is convergence's);
    - ``flops_counted``: the trial's FLOPs under its benchmark's ``valid_flops.counting`` convention,
      named in ``flops_counting``; ``flops_per_s`` = flops_counted / run time, ``penalty`` and
      ``valid_flops_per_s`` (HPC AI500, mlcampaign.analysis.valid_flops) with the benchmark's
      ``valid_flops`` exponent and cap; ``valid_flops_per_watt`` = valid_flops_per_s / mean_power_w
      (NaN where the energy was not measured);
    - ``io_fraction``, ``compute_fraction``, ``communication_fraction``: shares of the measured
      training-step time (data loading + compute + communication).
    """
    trials = trials.drop_duplicates(subset=TRIAL_KEYS, keep="last")
    frame = planned.merge(trials, on=TRIAL_KEYS, how="left", validate="one_to_one")
    frame["status"] = frame["status"].fillna(NOT_RUN)
    if known_outcomes is not None and len(known_outcomes):
        outcome = known_outcomes.set_index(TRIAL_KEYS).reindex(pd.MultiIndex.from_frame(frame[TRIAL_KEYS]))
        hit = outcome["failure_reason"].notna().to_numpy() & (frame["status"] == NOT_RUN).to_numpy()
        frame.loc[hit, "status"] = "failed"
        for column in ("failure_reason", "failure_message"):
            frame.loc[hit, column] = outcome[column].to_numpy()[hit]
    ok = frame["status"] == "ok"
    frame["valid"] = ok & frame["reached_target"].fillna(False).astype(bool)
    frame["time_to_train_s"] = frame["run_time_s"].where(frame["valid"])
    with np.errstate(divide="ignore", invalid="ignore"):
        frame["time_per_sample_s"] = frame["time_to_train_s"] / frame["samples_trained"].where(
            frame["samples_trained"] > 0
        )
    counting = {name: counting_of(b["valid_flops"]) for name, b in benchmarks.items()}
    frame["flops_counting"] = frame["benchmark"].map({name: counting_label(c) for name, c in counting.items()})
    frame["flops_counted"] = np.nan
    for name, convention in counting.items():
        rows = (frame["benchmark"] == name).to_numpy()
        inputs = frame.loc[rows]
        frame.loc[rows, "flops_counted"] = counted_flops(
            convention,
            inputs["flops_total"],
            inputs["train_flops_per_sample"],
            inputs["forward_flops_per_sample"],
            inputs["samples_trained"],
            inputs["samples_evaluated"],
            inputs["train_set_samples"],
        )
    with np.errstate(divide="ignore", invalid="ignore"):
        frame["flops_per_s"] = (frame["flops_counted"] / frame["run_time_s"]).where(ok)
    exponent = frame["benchmark"].map({name: b["valid_flops"]["exponent"] for name, b in benchmarks.items()})
    cap = frame["benchmark"].map({name: b["valid_flops"]["cap"] for name, b in benchmarks.items()})
    frame["penalty"] = valid_flops_penalty(
        frame["achieved_quality"].to_numpy(float),
        frame["target_value"].to_numpy(float),
        frame["target_direction"].to_numpy(object),
        exponent.to_numpy(float),
        cap.to_numpy(float),
    )
    frame["valid_flops_per_s"] = frame["flops_per_s"] * frame["penalty"]
    with np.errstate(divide="ignore", invalid="ignore"):
        frame["valid_flops_per_watt"] = frame["valid_flops_per_s"] / frame["mean_power_w"]
    step = frame[["data_loading_s", "compute_s", "communication_s"]].sum(axis=1, min_count=3)
    with np.errstate(divide="ignore", invalid="ignore"):
        for part, column in (("io", "data_loading_s"), ("compute", "compute_s"), ("communication", "communication_s")):
            frame[f"{part}_fraction"] = (frame[column] / step).where(ok & (step > 0))
    return frame


def flatten(records: list[dict]) -> pd.DataFrame:
    """Every field of every record (trials.csv): one row per record, nested keys joined with '.', lists
    kept as JSON text."""
    table = pd.json_normalize(records, sep=".")
    for column in table.columns:
        if table[column].map(lambda value: isinstance(value, list)).any():
            table[column] = table[column].map(json.dumps)
    return table
