"""Published MLPerf HPC results beside a campaign's own cells (the merged view: mlcampaign.history.merge).

Published runs come from the results store (``ResultsStore.published_results``; imported by
``mlcampaign import-mlperf``). They join two tables, every published row marked ``origin`` "published"
with its ``round``, ``submitter``, ``source`` and, for a result published in several places (the same log
bytes in two rounds, e.g. Dell's v2.0 DeepCAM logs again in v3.0), ``also_published_in``: one row per
distinct result, under its first round (rounds in version order), naming the others:

- ``ranking``: each strong-scaling published entry (round, submitter, system) of a benchmark the campaign
  runs is ranked with the campaign's cells by Valid FLOPS; its result logs are its trials
  (``published_trials``). Valid FLOPS where the project counts the model's FLOPs (CosmoFlow, DeepCAM: at the
  MLPerf model size, counted at import): FLOPs under the campaign benchmark's ``valid_flops.counting`` over
  each log's time to train, with the campaign benchmark's penalty against MLPerf's target (which a
  converged published run meets);
- ``mlperf_results`` (``mlperf_results_table``): one row per published (round, submitter, system, scaling,
  benchmark), oc20 and openfold included, and per measured cell of the campaign's MLPerf HPC benchmarks:
  time to train by the MLPerf rules (the summarizer's score; for a cell, mlperf-logging's olympic average of
  its trials, a trial that missed the target counting as a dropped run), resource-minutes (time x
  accelerators, or x nodes on a system without accelerators, such as Fugaku's A64FX or a CPU system of the
  campaign), the mean Valid FLOPS, and scaling: the speedup in time to train over the smallest scale of the
  same submitter (round, benchmark) or of the same cell series, and the efficiency that speedup is of the
  added resources.

Weak scaling, as the HPC rules define it: a system of T accelerators (nodes without) trains M models at once,
each on an instance of S accelerators, all of them in TTTa (the summarizer's number_of_models, instance_scale
and time_to_train_all; T is the systems description's). Its row has the system's scale, the M models and
their throughput M / TTTa (models per minute), and resources per instance: each model holds its instance for
TTTa, ``resource_minutes`` = min(M x S, T) x TTTa (a log that names the whole system as its instance's
scale, as NVIDIA's v3.0 DeepCAM and OpenFold logs do, counts the system once, not once per model) and
``resource_minutes_per_model`` = that / M, what one model cost (a strong-scaling row's resource-minutes).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from mlcampaign.analysis.frame import CELL_COLUMNS, CELL_KEYS
from mlcampaign.analysis.valid_flops import counted_flops, counting_label, counting_of, valid_flops_penalty
from mlcampaign.plan import registry
from mlcampaign.records.mlperf.result_logs import USAGE
from mlcampaign.records.mlperf.scores import olympic_average
from mlcampaign.records.mlperf.system_descriptions import system_summary

MEASURED, PUBLISHED = "measured", "published"
ORIGIN_COLUMNS = ["origin", "round", "submitter", "source", "also_published_in"]
# What the ranking shows of a published entry's trials (its result logs), besides the cell keys and columns.
_TRIAL_METRICS = [
    "time_to_train_s",
    "valid_flops_per_s",
    "flops_per_s",
    "penalty",
    "achieved_quality",
    "valid_flops_per_watt",
    "energy_to_train_j",
]
MLPERF_RESULTS_COLUMNS = [
    *ORIGIN_COLUMNS,
    "benchmark",
    "mlperf_benchmark",
    "system",
    "cell",
    "scaling",
    "division",
    "nodes",
    "accelerators_per_node",
    "accelerator",
    "runs",
    "time_to_train_min",
    "resource_minutes",
    "resource_minutes_per_model",
    "resource",
    "valid_flops_per_s",
    "flops_counting",
    "speedup",
    "scaling_efficiency",
    "number_of_models",
    "instance_scale",
    "throughput_models_per_min",
    "rcp",
]


@dataclasses.dataclass(frozen=True)
class PublishedResults:
    """The published runs to show beside a campaign (as ResultsStore.published_results returns them) and
    the device of each of the campaign's systems ("cpu": resource-minutes are node-minutes)."""

    runs: Sequence[Mapping]
    system_devices: Mapping[str, str] = dataclasses.field(default_factory=dict)


def mlperf_hpc_name(benchmark: Mapping) -> str | None:
    """The MLPerf HPC benchmark a campaign benchmark config is (its model's registry entry), or None."""
    rules = registry.mlperf_rules(benchmark, USAGE)
    return rules.name if rules is not None else None


def campaign_names(benchmarks: Mapping[str, Mapping]) -> dict[str, list[str]]:
    """The campaign's benchmarks by the MLPerf HPC benchmark each is."""
    names: dict[str, list[str]] = {}
    for name, config in sorted(benchmarks.items()):
        mlperf = mlperf_hpc_name(config)
        if mlperf is not None:
            names.setdefault(mlperf, []).append(name)
    return names


def _rules(mlperf_name: str) -> registry.MLPerfRules | None:
    models = registry.mlperf_models(USAGE, mlperf_name)
    return next(iter(models.values())).mlperf if models else None


def _scale(record: Mapping, system: Mapping) -> tuple[int, int]:
    """(nodes, accelerators per node) of a run: its log's, else its systems JSON's."""
    nodes = record.get("number_of_nodes")
    per_node = record.get("accelerators_per_node")
    return int(nodes if nodes is not None else system["nodes"]), int(
        per_node if per_node is not None else system["accelerators_per_node"]
    )


def _log_valid_flops(record: Mapping, flops: Mapping | None, config: Mapping | None) -> dict:
    """Valid FLOPS of one published log under the campaign benchmark ``config``'s counting and penalty
    (NaN where the project has no FLOP count of the benchmark or the campaign does not run it)."""
    missing = {"flops_per_s": np.nan, "penalty": np.nan, "valid_flops_per_s": np.nan, "flops_counting": ""}
    rules = _rules(record["benchmark"])
    if flops is None or config is None or rules is None or record["samples_trained"] is None:
        return missing
    counting = counting_of(config["valid_flops"])
    evaluated = record["samples_evaluated"] or 0
    done = flops["train_per_sample"] * record["samples_trained"] + flops["forward_per_sample"] * evaluated
    counted = counted_flops(
        counting,
        done,
        flops["train_per_sample"],
        flops["forward_per_sample"],
        record["samples_trained"],
        evaluated,
        record["train_samples"],
    )
    flops_per_s = float(counted) / (record["time_to_train_min"] * 60)
    penalty = valid_flops_penalty(
        record["quality"],
        rules.target,
        rules.target_direction,
        config["valid_flops"]["exponent"],
        config["valid_flops"].get("cap", 1.0),
    )
    return {
        "flops_per_s": flops_per_s,
        "penalty": penalty,
        "valid_flops_per_s": flops_per_s * penalty,
        "flops_counting": counting_label(counting),
    }


def in_round_order(runs: Sequence[Mapping]) -> list[Mapping]:
    """Published runs by round (in version order: v1.0 before v2.0 before v10.0), submitter and system."""

    def order(run: Mapping) -> tuple:
        version = re.fullmatch(r"v(\d+)\.(\d+)", str(run["round"]))
        return (tuple(map(int, version.groups())) if version else (math.inf,), str(run["round"]))

    return sorted(runs, key=lambda run: (*order(run), run["submitter"], run["system"]))


def _place(run: Mapping) -> str:
    return f"{run['round']} {run['submitter']}/{run['system']}"


def published_trials(published: PublishedResults, benchmarks: Mapping[str, Mapping]) -> pd.DataFrame:
    """One row per distinct strong-scaling result log of the published runs (a log in several rounds under its
    first, naming the others), under each campaign benchmark that is its MLPerf benchmark, as a trial of its
    published entry: cell keys (system "<submitter>/<system>", cell "<round>-<nodes>x<accelerators per
    node>"), cell columns, status "published", the ranking's metrics and ORIGIN_COLUMNS."""
    names = campaign_names(benchmarks)
    rows, first_place = [], {}
    for run in in_round_order(published.runs):
        system = system_summary(run["description"])
        flops = {score["benchmark"]: score.get("flops") for score in run["scores"] if score["scaling"] == "strong"}
        for log in run["logs"]:
            if log["scaling"] != "strong" or not names.get(log["benchmark"]):
                continue
            record = log["record"]
            if record["sha256"] in first_place:
                first_place[record["sha256"]].append(_place(run))
                continue
            first_place[record["sha256"]] = places = []
            nodes, per_node = _scale(record, system)
            for name in names[log["benchmark"]]:
                rows.append(
                    {
                        "system": f"{run['submitter']}/{run['system']}",
                        "benchmark": name,
                        "cell": f"{run['round']}-{nodes}x{per_node}",
                        "scale": f"{nodes}x{per_node}",
                        "processes": nodes * max(per_node, 1),
                        "precision": "",
                        "compression": "",
                        "framework": system["framework"],
                        "backend": "",
                        "status": PUBLISHED,
                        "time_to_train_s": record["time_to_train_min"] * 60,
                        "achieved_quality": record["quality"],
                        "valid_flops_per_watt": np.nan,
                        "energy_to_train_j": np.nan,
                        **_log_valid_flops(record, flops.get(log["benchmark"]), benchmarks[name]),
                        "origin": PUBLISHED,
                        "round": run["round"],
                        "submitter": run["submitter"],
                        "source": run["source"],
                        "also_published_in": places,  # filled in as later places of the log are met
                    }
                )
    for row in rows:
        row["also_published_in"] = ", ".join(dict.fromkeys(row["also_published_in"]))
    columns = [*CELL_KEYS, *CELL_COLUMNS, "status", *_TRIAL_METRICS, "flops_counting", *ORIGIN_COLUMNS]
    # Typed, also when empty: the ranking's bootstrap resamples these columns beside the campaign's trials.
    return pd.DataFrame(rows, columns=columns).astype({metric: float for metric in _TRIAL_METRICS})


def published_cells(trials: pd.DataFrame) -> pd.DataFrame:
    """The published entries of ``published_trials`` as the ranking lists cells: one row each."""
    cells = trials[[*CELL_KEYS, *CELL_COLUMNS, "status", *ORIGIN_COLUMNS]].drop_duplicates(CELL_KEYS)
    # An entry is published elsewhere too where any of its logs is.
    places = trials.groupby(CELL_KEYS, sort=False)["also_published_in"].agg(
        lambda texts: ", ".join(dict.fromkeys(place for text in texts if text for place in text.split(", ")))
    )
    return cells.drop(columns="also_published_in").merge(places.reset_index(), on=CELL_KEYS)[cells.columns]


def olympic_time_to_train_min(minutes: Sequence[float], dropped: int) -> float:
    """mlperf-logging's olympic average of times to train (minutes; a dropped run is a trial that missed the
    target), NaN where it gives none (more than one run dropped, or too few runs)."""
    score = olympic_average(minutes, dropped)
    return np.nan if score is None else score


def _resource(nodes: int, accelerators_per_node: int, minutes: float) -> tuple[float, str]:
    if accelerators_per_node > 0:
        return minutes * nodes * accelerators_per_node, "accelerator-minutes"
    return minutes * nodes, "node-minutes"


def _weak_figures(score: Mapping, system: Mapping) -> dict:
    """A weak-scaling score's row figures (module docstring): the system's scale, models, their throughput,
    instance scale and resources per instance."""
    nodes, per_node = system["nodes"], system["accelerators_per_node"]
    minutes, models = score["time_to_train_all_min"], score["number_of_models"]
    row = {
        "cell": f"{nodes}x{per_node}",
        "nodes": nodes,
        "accelerators_per_node": per_node,
        "runs": models,
        "number_of_models": models,
        "instance_scale": score["instance_scale"],
        "throughput_models_per_min": score["throughput_models_per_min"],
        "time_to_train_min": minutes,
    }
    if minutes is not None and models and score["instance_scale"] is not None:
        unit = "accelerator-minutes" if per_node > 0 else "node-minutes"
        held = min(models * score["instance_scale"], nodes * max(per_node, 1))
        row |= {"resource_minutes": held * minutes, "resource": unit}
        row["resource_minutes_per_model"] = row["resource_minutes"] / models
    return row


def _strong_figures(score: Mapping, records: Sequence[Mapping], system: Mapping) -> dict:
    nodes, per_node = _scale(records[0], system) if records else (system["nodes"], system["accelerators_per_node"])
    minutes = score["time_to_train_min"]
    row = {
        "cell": f"{nodes}x{per_node}",
        "nodes": nodes,
        "accelerators_per_node": per_node,
        "runs": score["counted_runs"],
        "time_to_train_min": minutes,
    }
    if minutes is not None:
        row["resource_minutes"], row["resource"] = _resource(nodes, per_node, minutes)
        row["resource_minutes_per_model"] = row["resource_minutes"]
    return row


def published_results_rows(runs: Sequence[Mapping]) -> list[dict]:
    """One row per distinct published result (a (round, submitter, system, scaling, benchmark) folder; one whose
    logs are byte for byte an earlier round's folder's is that row, naming it in ``also_published_in``), with
    the published columns of MLPERF_RESULTS_COLUMNS (no campaign benchmark, no Valid FLOPS)."""
    rows, first_row = [], {}
    for run in in_round_order(runs):
        system = system_summary(run["description"])
        logs: dict[tuple, list[Mapping]] = {}
        for log in run["logs"]:
            logs.setdefault((log["scaling"], log["benchmark"]), []).append(log["record"])
        for score in run["scores"]:
            records = logs.get((score["scaling"], score["benchmark"]), [])
            content = (score["scaling"], score["benchmark"], frozenset(record["sha256"] for record in records))
            if records and content in first_row:
                first_row[content]["also_published_in"].append(_place(run))
                continue
            row = {
                "origin": PUBLISHED,
                "round": run["round"],
                "submitter": run["submitter"],
                "source": run["source"],
                "also_published_in": [],
                "mlperf_benchmark": score["benchmark"],
                "system": run["system"],
                "scaling": score["scaling"],
                "division": score["division"],
                "accelerator": system["accelerator"] or "none (CPU only)",
                "rcp": score.get("rcp"),
            }
            figures = _strong_figures(score, records, system) if score["scaling"] == "strong" else None
            row |= figures or _weak_figures(score, system)
            row["cell"] = f"{run['round']}-{row['cell']}"
            first_row[content] = row
            rows.append(row)
    for row in rows:
        row["also_published_in"] = ", ".join(dict.fromkeys(row["also_published_in"]))
    return rows


def _published_rows(published: PublishedResults, benchmarks: Mapping[str, Mapping], ranked: pd.DataFrame) -> list[dict]:
    """The published rows of the mlperf_results table: each distinct result under each campaign benchmark that
    is its MLPerf benchmark (or its MLPerf name, where none is), with the mean Valid FLOPS of its ranked logs."""
    names = campaign_names(benchmarks)
    valid_flops = ranked.groupby(["system", "cell", "benchmark"])["valid_flops_per_s"].mean().to_dict()
    countings = ranked.groupby(["system", "cell", "benchmark"])["flops_counting"].first().to_dict()
    rows = []
    for row in published_results_rows(published.runs):
        for name in names.get(row["mlperf_benchmark"], [None]):
            key = (f"{row['submitter']}/{row['system']}", row["cell"], name)
            strong = row["scaling"] == "strong"
            rows.append(
                row
                | {
                    "benchmark": name or row["mlperf_benchmark"],
                    "valid_flops_per_s": valid_flops.get(key, np.nan) if strong else np.nan,
                    "flops_counting": countings.get(key, "") if strong else "",
                }
            )
    return rows


def _measured_rows(
    frame: pd.DataFrame, benchmarks: Mapping[str, Mapping], system_devices: Mapping[str, str]
) -> list[dict]:
    rows = []
    names = {name: mlperf_hpc_name(config) for name, config in benchmarks.items()}
    ran = frame.loc[frame["status"].isin(["ok", "failed"]) & frame["benchmark"].map(names).notna()]
    for (system, benchmark, cell), trials in ran.groupby(CELL_KEYS, sort=True):
        valid = trials.loc[trials["valid"]]
        minutes = olympic_time_to_train_min((valid["time_to_train_s"] / 60).tolist(), len(trials) - len(valid))
        first = trials.iloc[0]
        nodes = int(first["nodes"])
        per_node = 0 if system_devices.get(system) == "cpu" else int(first["tasks_per_node"])
        row = {
            "origin": MEASURED,
            "source": "this campaign",
            "benchmark": benchmark,
            "mlperf_benchmark": names[benchmark],
            "system": system,
            "cell": cell,
            "scaling": "strong" if first["batch_scaling"] != "weak" else "weak",
            "division": "",
            "nodes": nodes,
            "accelerators_per_node": per_node,
            "accelerator": "none (CPU only)" if per_node == 0 else "",
            "runs": len(trials),
            "time_to_train_min": minutes,
            "valid_flops_per_s": trials.loc[trials["status"] == "ok", "valid_flops_per_s"].mean(),
            "flops_counting": first["flops_counting"],
            **{column: first[column] for column in ("precision", "compression", "framework", "backend")},
        }
        if np.isfinite(minutes):
            row["resource_minutes"], row["resource"] = _resource(nodes, per_node, minutes)
            row["resource_minutes_per_model"] = row["resource_minutes"]
        rows.append(row)
    return rows


def _with_scaling(table: pd.DataFrame) -> pd.DataFrame:
    """Speedup in time to train over the smallest resource count of each series, and its efficiency: a
    submitter's runs of one benchmark in one round and division (its published scales), or a cell series of
    this campaign (one system, benchmark, precision, compression, framework, backend)."""
    table["speedup"], table["scaling_efficiency"] = np.nan, np.nan
    units = table["nodes"] * table["accelerators_per_node"].clip(lower=1)
    strong = (table["scaling"] == "strong") & table["time_to_train_min"].notna()
    series = table[["origin", "round", "submitter", "benchmark", "division", "precision", "compression", "framework"]]
    series = series.assign(backend=table["backend"])
    keys = series.assign(system=table["system"].where(table["origin"] == MEASURED, "")).astype(object).fillna("")
    keys = keys.astype(str)
    for _, rows in table.loc[strong].groupby([keys.loc[strong, column] for column in keys.columns]):
        if len(rows) < 2:
            continue
        base = units.loc[rows.index].idxmin()
        speedup = rows.loc[base, "time_to_train_min"] / rows["time_to_train_min"]
        table.loc[rows.index, "speedup"] = speedup
        table.loc[rows.index, "scaling_efficiency"] = speedup / (units.loc[rows.index] / units.loc[base])
    return table


def mlperf_results_table(
    published: PublishedResults, frame: pd.DataFrame, benchmarks: Mapping[str, Mapping], ranked: pd.DataFrame
) -> pd.DataFrame:
    """The ``mlperf_results`` table (module docstring). ``frame``: the planned trials (campaign_frame);
    ``ranked``: ``published_trials`` of the same published runs (their per-log Valid FLOPS)."""
    rows = _measured_rows(frame, benchmarks, published.system_devices) + _published_rows(published, benchmarks, ranked)
    table = pd.DataFrame(rows).reindex(
        columns=[*MLPERF_RESULTS_COLUMNS, "precision", "compression", "framework", "backend"]
    )
    table = _with_scaling(table)
    table = table.sort_values(
        ["benchmark", "origin", "round", "submitter", "system", "cell"], na_position="first", kind="stable"
    )
    return table[MLPERF_RESULTS_COLUMNS].reset_index(drop=True)
