"""All tables of a campaign, built from the planned trial matrix and whichever records exist."""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd

from mlcampaign.analysis.capability import campaign_summary, capability_matrix
from mlcampaign.analysis.frame import CELL_KEYS, campaign_frame, planned_frame, trial_frame
from mlcampaign.analysis.mlperf_results import (
    PublishedResults,
    mlperf_results_table,
    published_cells,
    published_trials,
)
from mlcampaign.analysis.outputs import TABLE_FORMATS
from mlcampaign.analysis.ranking import METRIC as RANKING_METRIC
from mlcampaign.analysis.ranking import ranking_table
from mlcampaign.analysis.repeatability import SUMMARISED_METRICS, convergence_table, repeatability_table
from mlcampaign.analysis.scaling import CELL_METRICS as SCALING_METRICS
from mlcampaign.analysis.scaling import scaling_tables
from mlcampaign.analysis.stats import CellBootstrap
from mlcampaign.analysis.units import readable

# One bootstrap of the cells serves every table.
BOOTSTRAP_METRICS = list(dict.fromkeys([*SUMMARISED_METRICS, *SCALING_METRICS, RANKING_METRIC]))


def build_tables(
    records: Iterable[Mapping],
    plan: pd.DataFrame,
    benchmarks: Mapping[str, Mapping],
    *,
    confidence: float,
    bootstrap_resamples: int,
    seed: int,
    unplanned: pd.DataFrame | None = None,
    known_outcomes: pd.DataFrame | None = None,
    exclude_contended: bool = False,
    published: PublishedResults | None = None,
) -> dict[str, pd.DataFrame]:
    """Every table of TABLES. ``plan``: the planned trial matrix; ``records``: validated
    records of (some of) those trials; ``benchmarks``: benchmark configs by name (``valid_flops``);
    ``unplanned``: the pairs not planned as jobs (Campaign.unplanned_cells), for the capability matrix;
    ``known_outcomes``: trials without a readable record whose outcome is known otherwise (their job was
    killed by the scheduler, mlcampaign.job.slurm_accounting.killed_trials; their record cannot be read).
    ``exclude_contended``: leave trials whose timing was disturbed (``contended``) out of the statistics;
    planned_trials and the summary still list them, flagged. ``published``: published MLPerf HPC runs to rank
    beside the cells and to list in the ``mlperf_results`` table (mlcampaign.analysis.mlperf_results)."""
    frame = campaign_frame(planned_frame(plan), trial_frame(records), benchmarks, known_outcomes)
    ok = frame["status"] == "ok"
    if exclude_contended:
        ok &= ~frame["contended"].fillna(False).astype(bool)
    ok_trials = frame.loc[ok]
    # Published entries are ranked with the cells: their logs join the resampled trials (the tables other
    # than the ranking look up their own cells only).
    others = published_trials(published, benchmarks) if published is not None else None
    ranked = ok_trials if others is None or others.empty else pd.concat([ok_trials, others], ignore_index=True)
    bootstrap = CellBootstrap(ranked, CELL_KEYS, BOOTSTRAP_METRICS, bootstrap_resamples, seed)
    capability = capability_matrix(frame, unplanned)
    scaling = scaling_tables(ok_trials, bootstrap, confidence)
    extra = {}
    if others is not None:
        extra["mlperf_results"] = mlperf_results_table(published, frame, benchmarks, others)
    return {
        "summary": campaign_summary(frame),
        "capability": capability,
        "planned_trials": frame,
        "repeatability": repeatability_table(ok_trials, bootstrap, confidence),
        "convergence": convergence_table(ok_trials, confidence),
        "ranking": ranking_table(
            ranked, capability, bootstrap, confidence, None if others is None else published_cells(others)
        ),
        "scaling_strong": scaling["strong"],
        "scaling_weak": scaling["weak"],
        **extra,
    }


def table_outputs(output: Mapping[str, str], names) -> dict[str, dict[str, str]]:
    """The paths of tables ``names`` in each format among a rule's outputs (named ``<table>_<format>``)."""
    return {name: {fmt: output[f"{name}_{fmt}"] for fmt in TABLE_FORMATS} for name in names}


def write_tables(tables: Mapping[str, pd.DataFrame], paths: Mapping[str, Mapping[str, str | Path]]) -> None:
    """Write each table in each format: ``paths[name][format]`` (formats of TABLE_FORMATS)."""
    for name, table in tables.items():
        table.to_csv(paths[name]["csv"], index=False)
        table.to_parquet(paths[name]["parquet"], index=False)


_VIEW_STYLE = """
body { font-family: sans-serif; font-size: 13px; margin: 1em; }
table { border-collapse: collapse; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: right; white-space: nowrap; }
th { background: #eee; position: sticky; top: 0; }
tr:nth-child(even) td { background: #f8f8f8; }
"""


def html_view(table: pd.DataFrame, name: str, description: str) -> str:
    """A self-contained HTML page of ``table`` for the report: metrics in human units
    (mlcampaign.analysis.units: 8.18 GFLOP/s, 3 min 12 s), other numbers to 4 significant digits."""
    shown = readable(table, RANKING_METRIC if name == "ranking" else None)
    body = shown.to_html(index=False, na_rep="", float_format=lambda value: f"{value:.4g}", border=0)
    return (
        f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(name)}</title>"
        f"<style>{_VIEW_STYLE}</style></head><body>\n<h2>{html.escape(name)}</h2>\n"
        f"<p>{html.escape(description)}; {len(table)} rows. Full precision: tables/{html.escape(name)}.csv "
        f"and .parquet.</p>\n{body}\n</body></html>\n"
    )
