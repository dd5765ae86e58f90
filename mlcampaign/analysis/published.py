"""Measured cells beside a study's published numbers (config/published/<study>.yaml), with a verdict.

A published entry names the study's system, the benchmark, the run's configuration as far as the
paper states it (scale or process count, precision, gradient compression) and the measured metric
it corresponds to. It stands beside every measured cell of

- the same system, or a system of the campaign that the campaign's ``published.systems`` maps to
  it (a stand-in, e.g. this machine for the paper's ARCHER2 runs), or any system where the entry's
  system is null (the study's own machine is none of config/systems);
- the same benchmark, or one that ``published.benchmarks`` maps to it (a stand-in, e.g. a
  small-data ResNet-50 for the paper's);
- the same value of each configuration dimension the entry states, except the layout (scale,
  processes) on a stand-in system: it differs by design, and the table states both.

Verdict of a row (direction: every compared metric is higher-is-better):

- "within published tolerance": the measured mean lies inside the published tolerance band;
- "within CI": no tolerance is published and the published value lies inside the measured mean's
  t interval over the cell's ok trials (at the campaign's confidence);
- "faster" / "slower": otherwise, by the sign of the difference;
- "no published number": the entry's value is null, or no entry matches the cell (the study file's
  ``unlisted`` text says why);
- "not measured: <outcome>": a published number whose cell has no ok trial in this campaign, or an
  unplanned pair (expected outcome, system without launcher) with the capability outcome.

A Valid FLOPS row states which FLOPs each side counts: ``measured_flops_counting`` (the cell's
benchmark's ``valid_flops.counting``, mlcampaign.analysis.valid_flops) and
``published_flops_counting`` (the entry's ``flops_counting``, same keys; "not stated" without one).
Where both are known and differ, the note says the ratio is not like for like.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from mlcampaign.analysis.frame import CELL_KEYS
from mlcampaign.analysis.stats import describe
from mlcampaign.analysis.valid_flops import counting_label

# Per-trial metrics of the planned_trials table that published numbers compare with.
TRIAL_METRICS = {
    "throughput_samples_per_s": "training throughput incl. waiting for data (samples/s)",
    "compute_throughput_samples_per_s": "training throughput excl. waiting for data (samples/s)",
    "valid_flops_per_s": "HPC AI500 Valid FLOPS (FLOP/s)",
    "achieved_flops_per_s": "achieved FLOP/s of the training steps",
}
# The metrics whose value depends on the FLOP-counting convention (valid_flops.counting).
COUNTING_METRICS = ("valid_flops_per_s",)
NOT_STATED = "not stated"
# Per-cell metric of the scaling tables.
SCALING_METRICS = {"parallel_efficiency": "parallel efficiency vs the series' smallest scale (scaling tables)"}
CONFIGURATION_DIMENSIONS = ("scale", "processes", "precision", "compression")
VERDICTS = ("within published tolerance", "within CI", "faster", "slower", "no published number", "not measured")
COLUMNS = [
    "benchmark",
    "system",
    "cell",
    "published_benchmark",
    "published_system",
    "published_configuration",
    "metric",
    "published_metric",
    "units",
    "n",
    "measured",
    "measured_ci_low",
    "measured_ci_high",
    "published",
    "ratio",
    "tolerance",
    "measured_flops_counting",
    "published_flops_counting",
    "verdict",
    "source",
    "note",
]


def measured_cells(planned_trials: pd.DataFrame, scaling: Sequence[pd.DataFrame], confidence: float) -> pd.DataFrame:
    """One row per (cell, metric): n, mean and t interval of the cell's ok trials (TRIAL_METRICS),
    and each cell's parallel efficiency with its bootstrap interval (scaling tables); ``flops_counting``:
    the convention of a COUNTING_METRICS row (planned_trials' column of the same name), else empty."""
    ok = planned_trials.loc[planned_trials["status"] == "ok"].copy()
    # The measured step time without waiting for data: compute + unhidden communication.
    busy = ok["compute_fraction"] + ok["communication_fraction"]
    ok["compute_throughput_samples_per_s"] = (ok["throughput_samples_per_s"] / busy).where(busy > 0)
    stats = describe(ok, CELL_KEYS, list(TRIAL_METRICS), confidence).reset_index()
    stats = stats.rename(columns={"mean": "measured", "ci_t_low": "measured_ci_low", "ci_t_high": "measured_ci_high"})
    stats = stats.loc[stats["n"] > 0, [*CELL_KEYS, "metric", "n", "measured", "measured_ci_low", "measured_ci_high"]]
    conventions = ok.groupby(CELL_KEYS, sort=False)["flops_counting"].first().reset_index()
    stats = stats.merge(conventions, on=CELL_KEYS, how="left", validate="many_to_one")
    stats["flops_counting"] = stats["flops_counting"].where(stats["metric"].isin(COUNTING_METRICS), "")
    efficiency = (
        pd.concat([table for table in scaling if len(table)], ignore_index=True)
        if any(len(table) for table in scaling)
        else pd.DataFrame(columns=[*CELL_KEYS, "n", "efficiency", "efficiency_ci_low", "efficiency_ci_high"])
    )
    efficiency = efficiency.rename(
        columns={
            "efficiency": "measured",
            "efficiency_ci_low": "measured_ci_low",
            "efficiency_ci_high": "measured_ci_high",
        }
    )[[*CELL_KEYS, "n", "measured", "measured_ci_low", "measured_ci_high"]].assign(
        metric="parallel_efficiency", flops_counting=""
    )
    return pd.concat([stats, efficiency], ignore_index=True).astype({"n": int})


def _configuration_text(entry: Mapping) -> str:
    configuration = entry.get("configuration", {})
    parts = [
        f"{name}={configuration[name]}" if name != "scale" else configuration[name]
        for name in CONFIGURATION_DIMENSIONS
        if name in configuration
    ]
    return " ".join(parts) or "not stated"


def _matches(entry: Mapping, cell: Mapping, stand_ins: Mapping[str, Mapping]) -> bool:
    """Whether a published entry stands beside a measured cell (see the module docstring).
    ``stand_ins``: the campaign's ``published`` section (``systems`` and ``benchmarks`` maps)."""
    benchmark_stand_in = stand_ins["benchmarks"].get(cell["benchmark"]) == entry["benchmark"]
    if not (entry["benchmark"] == cell["benchmark"] or benchmark_stand_in):
        return False
    system_stand_in = entry["system"] in stand_ins["systems"].get(cell["system"], ())
    if not (entry["system"] is None or entry["system"] == cell["system"] or system_stand_in):
        return False
    # A stand-in system runs its own layout; the study's is stated beside it.
    stand_in = system_stand_in
    configuration = entry.get("configuration", {})
    return all(
        str(configuration[name]) == str(cell[name])
        for name in CONFIGURATION_DIMENSIONS
        if name in configuration and not (stand_in and name in ("scale", "processes"))
    )


def _verdict(measured: float, low: float, high: float, published: float, tolerance: Mapping | None) -> str:
    if tolerance is not None:
        if published * (1 - tolerance["below"]) <= measured <= published * (1 + tolerance["above"]):
            return "within published tolerance"
    elif np.isfinite(low) and np.isfinite(high) and low <= published <= high:
        return "within CI"
    return "faster" if measured > published else "slower"


def comparison_table(
    measured: pd.DataFrame,
    cells: pd.DataFrame,
    capability: pd.DataFrame,
    published: Mapping,
    stand_ins: Mapping[str, Mapping],
) -> pd.DataFrame:
    """Every measured cell beside each matching published number, every published number of the
    campaign's systems that no cell measured, and every unplanned pair (capability outcome).

    ``measured``: measured_cells(); ``cells``: one row per planned cell with CELL_KEYS and the
    CONFIGURATION_DIMENSIONS; ``capability``: the capability table (outcomes of cells and
    unplanned pairs); ``published``: load_published(); ``stand_ins``: the campaign's
    ``published`` section (``systems``: campaign system -> the study's systems it stands in for,
    ``benchmarks``: campaign benchmark -> the study's benchmark).
    """
    by_cell = {key: group for key, group in measured.groupby(CELL_KEYS, sort=False)}
    outcome = {tuple(row[:3]): row[3] for row in capability[[*CELL_KEYS, "outcome"]].itertuples(index=False)}
    rows, matched = [], set()
    for cell in cells.to_dict(orient="records"):
        entries = [(i, e) for i, e in enumerate(published["values"]) if _matches(e, cell, stand_ins)]
        matched.update(i for i, _ in entries)
        values = by_cell.get(_key(cell))
        if values is None:
            not_measured = f"not measured: {outcome.get(_key(cell), 'no ok trial')}"
            rows += [_row(published, cell, entry, verdict=not_measured) for _, entry in entries or [(None, None)]]
        else:
            rows += _measured_rows(published, cell, values, [entry for _, entry in entries])

    unplanned = capability.loc[capability["status"].isin(["expected", "not supported"])]
    for pair in unplanned.to_dict(orient="records"):
        entries = [
            (i, e)
            for i, e in enumerate(published["values"])
            if e["benchmark"] == pair["benchmark"] and e["system"] == pair["system"]
        ]
        matched.update(i for i, _ in entries)
        for _, entry in entries or [(None, None)]:
            rows.append(_row(published, pair, entry, verdict=f"not measured: {pair['outcome']}"))
    rows += _unmatched_rows(published, capability, matched)

    table = pd.DataFrame(rows).reindex(columns=COLUMNS)
    table["n"] = table["n"].fillna(0).astype(int)
    return table.sort_values(["benchmark", "system", "cell", "metric"], na_position="last", kind="stable").reset_index(
        drop=True
    )


def _row(published: Mapping, cell: Mapping, entry: Mapping | None, **values) -> dict:
    """One row of the comparison: a cell (or placeholder) beside a published entry (None: no entry matches)."""
    citation = published["citation"]
    if entry is None:
        base = dict.fromkeys(["published_benchmark", "published_system", "published_configuration"], "")
        base |= {"metric": "", "published_metric": "", "units": ""}
        base |= {"source": citation, "note": published["unlisted"]}
    else:
        base = {
            "published_benchmark": entry["benchmark"],
            "published_system": entry["system"] or entry.get("system_description", "not stated"),
            "metric": entry["metric"],
            "published_configuration": _configuration_text(entry),
            "published_metric": entry["published_metric"],
            "units": entry["units"],
            "published": entry["value"],
            "tolerance": _tolerance_text(entry),
            "published_flops_counting": _published_counting(entry),
            "source": f"{citation}; {entry['where']}",
            "note": entry.get("note", ""),
        }
    measured_counting = values.get("measured_flops_counting", "")
    if measured_counting and base.get("published_flops_counting") not in ("", NOT_STATED, measured_counting):
        base["note"] = "; ".join(
            filter(None, ["FLOP accounting differs from the study's: the ratio is not like for like", base["note"]])
        )
    return {key: cell[key] for key in CELL_KEYS} | base | values


def _measured_rows(published: Mapping, cell: Mapping, values: pd.DataFrame, entries: list[Mapping]) -> list[dict]:
    """A measured cell beside each of its matching published entries, with a verdict; without one, its
    throughput (no number to compare it with)."""
    metrics = values.set_index("metric")
    rows = []
    for entry in entries:
        if entry["metric"] not in metrics.index:
            rows.append(_row(published, cell, entry, verdict=f"not measured: no {entry['metric']} in this cell"))
            continue
        measure = metrics.loc[entry["metric"]]
        scale = entry["scale_to_measured"]
        found = {
            "n": int(measure["n"]),
            "measured": measure["measured"] / scale,
            "measured_ci_low": measure["measured_ci_low"] / scale,
            "measured_ci_high": measure["measured_ci_high"] / scale,
            "measured_flops_counting": measure["flops_counting"],
        }
        if entry["value"] is None:
            rows.append(_row(published, cell, entry, **found, verdict="no published number"))
            continue
        verdict = _verdict(
            found["measured"],
            found["measured_ci_low"],
            found["measured_ci_high"],
            entry["value"],
            entry.get("tolerance"),
        )
        rows.append(_row(published, cell, entry, **found, ratio=found["measured"] / entry["value"], verdict=verdict))
    if not entries:
        shown = values.loc[values["metric"] == "throughput_samples_per_s"].drop(columns=CELL_KEYS)
        found = shown.iloc[0].to_dict() if len(shown) else {}
        rows.append(_row(published, cell, None, **found, verdict="no published number"))
    return rows


def _unmatched_rows(published: Mapping, capability: pd.DataFrame, matched: set[int]) -> list[dict]:
    """Published numbers of this campaign's systems (or of the study's own machine) that no cell matched."""
    systems, benchmarks = set(capability["system"]), set(capability["benchmark"])
    rows = []
    for i, entry in enumerate(published["values"]):
        if i in matched or not (entry["system"] is None or entry["system"] in systems):
            continue
        if entry["system"] is None and entry["benchmark"] not in benchmarks:
            continue
        placeholder = {"system": entry["system"] or "", "benchmark": entry["benchmark"], "cell": ""}
        rows.append(
            _row(published, placeholder, entry, verdict="not measured: no cell of this campaign has this configuration")
        )
    return rows


def _key(cell: Mapping) -> tuple:
    return tuple(cell[key] for key in CELL_KEYS)


def _published_counting(entry: Mapping) -> str:
    if "flops_counting" in entry:
        return counting_label(entry["flops_counting"])
    return NOT_STATED if entry["metric"] in COUNTING_METRICS else ""


def _tolerance_text(entry: Mapping) -> str:
    tolerance = entry.get("tolerance")
    if tolerance is None:
        return "none published"
    return f"-{tolerance['below']:.0%}/+{tolerance['above']:.0%}"
