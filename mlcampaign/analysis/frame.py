"""The analysis view of a campaign: one row per planned trial, joined with its record if any.

Only the record fields the analysis needs are projected (``trial_frame``): flattening every field
of 100 000 records with ``pandas.json_normalize`` alone takes longer than the whole aggregation
may. ``trials.csv`` (mlcampaign.record.flatten) keeps every field.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

from mlcampaign.analysis.valid_flops import valid_flops_penalty
from mlcampaign.config import TRIAL_KEYS

# The coordinates of one cell (what repeatability, ranking and scaling group by), and what the
# cell name encodes, as separate columns.
CELL_KEYS = ["system", "benchmark", "cell"]
CELL_COLUMNS = ["scale", "processes", "precision", "compression", "framework", "backend"]
# Status of a planned trial: its record's status, or NOT_RUN when no record exists.
NOT_RUN = "not run"

_RECORD_COLUMNS = [
    *TRIAL_KEYS,
    "status",
    "failure_reason",
    "failure_message",
    "batch_scaling",
    "global_batch_size",
    "local_batch_size",
    "target_metric",
    "target_direction",
    "target_value",
    "devices_used",
    "peak_flops_per_s",
    "reached_target",
    "achieved_quality",
    "epochs_to_target",
    "epochs_run",
    "run_time_s",
    "throughput_samples_per_s",
    "data_loading_s",
    "compute_s",
    "communication_s",
    "flops_total",
    "achieved_flops_per_s",
    "fraction_of_peak",
    "roofline_fraction",
]


def _record_row(record: Mapping) -> tuple:
    trial, benchmark, metrics, flops = record["trial"], record["benchmark"], record["metrics"], record["flops"]
    failure = record["failure"] or {}
    return (
        trial["system"],
        trial["benchmark"],
        trial["cell"],
        trial["trial"],
        trial["replicate"],
        record["status"],
        failure.get("reason"),
        failure.get("message"),
        benchmark["batch_scaling"],
        benchmark["global_batch_size"],
        benchmark["local_batch_size"],
        benchmark["target_metric"],
        benchmark["target_direction"],
        benchmark["target_value"],
        record["system"]["devices_used"],
        record["system"]["peak_flops_per_s"],
        metrics["reached_target"],
        metrics["achieved_quality"],
        metrics["epochs_to_target"],
        metrics["epochs_run"],
        metrics["time_to_train_s"],
        metrics["throughput_samples_per_s"],
        metrics["data_loading_s"],
        metrics["compute_s"],
        metrics["communication_s"],
        flops["total"],
        flops["achieved_flops_per_s"],
        flops["fraction_of_peak"],
        # Records written before the roofline measurement have no roofline block.
        (record.get("roofline") or {}).get("achieved_fraction"),
    )


_TEXT_COLUMNS = {
    *CELL_KEYS,
    "status",
    "failure_reason",
    "failure_message",
    "batch_scaling",
    "target_metric",
    "target_direction",
}


def trial_frame(records: Iterable[Mapping]) -> pd.DataFrame:
    """One row per (validated) record with the fields the analysis uses; ``run_time_s`` is the
    record's ``metrics.time_to_train_s`` (run start to stop, whether or not the target was met)."""
    rows = [_record_row(record) for record in records]
    data = {}
    for position, name in enumerate(_RECORD_COLUMNS):
        values = [row[position] for row in rows]  # (zip(*rows) is slow for 100 000 rows)
        if name in _TEXT_COLUMNS:
            data[name] = pd.array(values, dtype="str")
        elif name == "reached_target":
            data[name] = pd.array(values, dtype="boolean")
        elif name in ("trial", "replicate"):
            data[name] = np.array(values, dtype=np.int64)
        else:  # numbers; None (not measured) becomes NaN
            data[name] = np.array(values, dtype=float)
    return pd.DataFrame(data, columns=_RECORD_COLUMNS)


def planned_frame(plan: pd.DataFrame) -> pd.DataFrame:
    """The planned trial matrix (``Campaign.trial_matrix()``) with a readable scale label."""
    planned = plan.reset_index(drop=True)
    planned["scale"] = planned["nodes"].astype(str) + "x" + planned["tasks_per_node"].astype(str)
    return planned[[*TRIAL_KEYS, "seed", "nodes", "tasks_per_node", *CELL_COLUMNS]]


def campaign_frame(
    planned: pd.DataFrame,
    trials: pd.DataFrame,
    benchmarks: Mapping[str, Mapping],
    killed: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Every planned trial with its record's fields (NaN and status NOT_RUN where there is none).

    A trial without a record that ``killed`` lists (TRIAL_KEYS, ``failure_reason``,
    ``failure_message``: its job was killed by the scheduler, mlcampaign.scheduler.killed_trials)
    is failed with that reason instead.

    Records of trials that are not planned (left over from an earlier plan) are ignored. Adds the
    per-trial quantities the tables use:

    - ``valid``: the trial is ok and reached the quality target;
    - ``time_to_train_s``: run time of trials that reached the target, NaN otherwise (MLPerf counts
      converged runs only);
    - ``flops_per_s`` = counted FLOPs / run time, ``penalty`` and ``valid_flops_per_s`` (HPC AI500,
      mlcampaign.analysis.valid_flops) with the benchmark's ``valid_flops`` exponent and cap;
    - ``io_fraction``, ``compute_fraction``, ``communication_fraction``: shares of the measured
      training-step time (data loading + compute + communication).
    """
    trials = trials.drop_duplicates(subset=TRIAL_KEYS, keep="last")
    frame = planned.merge(trials, on=TRIAL_KEYS, how="left", validate="one_to_one")
    frame["status"] = frame["status"].fillna(NOT_RUN)
    if killed is not None and len(killed):
        outcome = killed.set_index(TRIAL_KEYS).reindex(pd.MultiIndex.from_frame(frame[TRIAL_KEYS]))
        hit = outcome["failure_reason"].notna().to_numpy() & (frame["status"] == NOT_RUN).to_numpy()
        frame.loc[hit, "status"] = "failed"
        for column in ("failure_reason", "failure_message"):
            frame.loc[hit, column] = outcome[column].to_numpy()[hit]
    ok = frame["status"] == "ok"
    frame["valid"] = ok & frame["reached_target"].fillna(False).astype(bool)
    frame["time_to_train_s"] = frame["run_time_s"].where(frame["valid"])
    with np.errstate(divide="ignore", invalid="ignore"):
        frame["flops_per_s"] = (frame["flops_total"] / frame["run_time_s"]).where(ok)
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
    step = frame[["data_loading_s", "compute_s", "communication_s"]].sum(axis=1, min_count=3)
    with np.errstate(divide="ignore", invalid="ignore"):
        for part, column in (("io", "data_loading_s"), ("compute", "compute_s"), ("communication", "communication_s")):
            frame[f"{part}_fraction"] = (frame[column] / step).where(ok & (step > 0))
    return frame
