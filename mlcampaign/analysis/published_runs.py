"""The published MLPerf HPC runs a results store holds, as a person reads them (``mlcampaign published list|show``):
one row per distinct result with its figures in human units (2 min 6 s, 1,074 accelerator-minutes, 6.91 PFLOP/s),
or one published run in detail; as JSON, the same at full precision.

The rows are those of the ``mlperf_results`` table without a campaign (mlcampaign.analysis.mlperf_results:
the summarizer's figures, a result published in several rounds once, weak scaling per instance); nothing here
computes a figure of its own.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Mapping, Sequence

import pandas as pd

from mlcampaign.analysis.mlperf_results import in_round_order, published_results_rows
from mlcampaign.analysis.units import quantity
from mlcampaign.records.mlperf.system_descriptions import system_summary

# What a listing's row holds (full precision, as --json gives it), in this order.
LISTING_COLUMNS = [
    "round", "submitter", "system", "scaling", "mlperf_benchmark", "division", "cell", "nodes", "accelerators_per_node",
    "accelerator", "runs", "time_to_train_min", "number_of_models", "instance_scale", "throughput_models_per_min",
    "resource_minutes", "resource_minutes_per_model", "resource", "rcp", "also_published_in", "source",
]  # fmt: skip
# What a listing filters on: the row's column of each filter's name.
FILTERS = {"round": "round", "submitter": "submitter", "system": "system", "benchmark": "mlperf_benchmark"}
FILTERS |= {"scaling": "scaling"}


def _matches(row: Mapping, patterns: Mapping[str, str | None]) -> bool:
    """Whether ``row`` matches every given shell pattern (``fnmatch``, case-insensitive) of FILTERS."""
    return all(
        fnmatch.fnmatch(str(row[FILTERS[name]]).lower(), pattern.lower())
        for name, pattern in patterns.items()
        if pattern is not None
    )


def published_listing(runs: Sequence[Mapping], patterns: Mapping[str, str | None]) -> pd.DataFrame:
    """One row per distinct published result of ``runs`` (ResultsStore.published_results) that matches
    ``patterns`` (FILTERS -> a shell pattern, or None for any), LISTING_COLUMNS, in round order."""
    rows = [row for row in published_results_rows(runs) if _matches(row, patterns)]
    return pd.DataFrame(rows).reindex(columns=LISTING_COLUMNS)


def listing_json(listing: pd.DataFrame) -> str:
    """The listing as JSON, every figure at full precision (pandas' own writer rounds to 15 digits)."""
    rows = listing.astype(object).where(listing.notna(), None).to_dict(orient="records")
    return json.dumps(rows, indent=1, default=lambda value: value.item())  # numpy scalars


def _minutes(value) -> str:
    return "" if value is None or pd.isna(value) else quantity(float(value) * 60, "s")


def readable_listing(listing: pd.DataFrame) -> pd.DataFrame:
    """The listing as a person reads it: the scale as nodes x accelerators, times as durations, throughput in
    models per minute, resource-minutes with their unit, thousands separated."""
    shown = pd.DataFrame(
        {
            "round": listing["round"],
            "submitter": listing["submitter"],
            "system": listing["system"],
            "scaling": listing["scaling"],
            "benchmark": listing["mlperf_benchmark"],
            "division": listing["division"],
            "scale": [
                f"{nodes}x{per_node}" if per_node else f"{nodes} nodes"
                for nodes, per_node in zip(listing["nodes"], listing["accelerators_per_node"], strict=True)
            ],
            "accelerator": listing["accelerator"],
            "runs": listing["runs"],
            "time to train": listing["time_to_train_min"].map(_minutes),
            "models": [quantity(value, "") for value in listing["number_of_models"]],
            "throughput": [quantity(value, "models/min") for value in listing["throughput_models_per_min"]],
            "resources": [
                quantity(value, unit) if isinstance(unit, str) else ""
                for value, unit in zip(listing["resource_minutes"], listing["resource"], strict=True)
            ],
            "per model": [
                quantity(value, unit) if isinstance(unit, str) else ""
                for value, unit in zip(listing["resource_minutes_per_model"], listing["resource"], strict=True)
            ],
            "RCP": listing["rcp"].fillna(""),
            "also in": listing["also_published_in"].fillna(""),
        }
    )
    return shown


def _key(run: Mapping) -> str:
    return f"{run['round']}/{run['submitter']}/{run['system']}"


def published_text(
    runs: Sequence[Mapping], action: str, key: str | None, patterns: Mapping[str, str | None], *, as_json: bool
) -> str:
    """What ``mlcampaign published`` prints: ``list`` the results of ``runs`` matching ``patterns`` (FILTERS),
    ``show`` the run ``key`` ("<round>/<submitter>/<system>"), as text or JSON. LookupError (its message
    naming the runs there are) for a run that is not among them."""
    if action == "list":
        listing = published_listing(runs, patterns)
        if as_json:
            return listing_json(listing)
        if listing.empty:
            return f"no published result{' matches' if any(patterns.values()) else ''}"
        return readable_listing(listing).to_string(index=False)
    found = [run for run in runs if _key(run) == key]
    if not found:
        known = ", ".join(_key(run) for run in in_round_order(runs)) or "none"
        what = "published show takes a run" if key is None else f"no published run {key!r}"
        raise LookupError(f"{what} (<round>/<submitter>/<system>); published runs: {known}")
    return json.dumps(found[0], indent=1) if as_json else run_details(found[0])


def run_details(run: Mapping) -> str:
    """One published run as text: where it is from, its system, each result's figures, and each log."""
    system = system_summary(run["description"])
    accelerator = system["accelerator"] or "none (CPU only)"
    lines = [
        f"{run['round']} {run['submitter']} {run['system']}",
        f"  source: {run['source']}",
        f"  system: {system['system_name']}: {system['nodes']} nodes x {system['accelerators_per_node']} accelerators "
        f"({accelerator}), host {system['host_cpu']}; {system['framework']}; {system['division']}, "
        f"{system['availability']}",
    ]
    listing = readable_listing(published_listing([run], {}))
    lines += [
        "",
        *(
            "  " + line
            for line in listing.drop(columns=["round", "submitter", "system"]).to_string(index=False).splitlines()
        ),
    ]
    logs = pd.DataFrame(
        [
            {
                "scaling": log["scaling"],
                "benchmark": log["benchmark"],
                "file": log["file"],
                "time to train": _minutes(log["record"]["time_to_train_min"]),
                "quality": f"{log['record']['quality_key']} {log['record']['quality']:.4g}"
                if log["record"]["quality"] is not None
                else "",
                "epochs": ""
                if log["record"]["epochs_to_converge"] is None
                else f"{log['record']['epochs_to_converge']:g}",
                "seed": "" if log["record"]["seed"] is None else str(log["record"]["seed"]),
                "sha256": log["record"]["sha256"][:12],
            }
            for log in run["logs"]
        ]
    )
    lines += ["", f"  {len(run['logs'])} result logs:"]
    lines += ["  " + line for line in logs.to_string(index=False).splitlines()] if len(logs) else []
    return "\n".join(lines)
