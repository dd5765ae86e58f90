"""Capability matrix and campaign completeness: every planned cell, with what became of it.

A cell's status: "ok" (every planned trial produced an ok record), "failed" (no ok trial, at least
one failure record), "not run" (no record at all: the job died before writing one, or has not run
yet), "partial" (some ok trials, some failed or missing). Failure reasons come from the records
(``failure.reason``, mlcampaign.plan.registry.FAILURE_REASONS).

Pairs the campaign does not plan as jobs (mlcampaign.plan.config.Campaign.unplanned_cells) are rows
too: "expected" (a published outcome such as out of memory, declared in the campaign's
``expected_outcomes``) or "not supported" (a system this project has no launcher for).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from mlcampaign.analysis.frame import CELL_COLUMNS, CELL_KEYS, NOT_RUN
from mlcampaign.plan.registry import FAILURE_REASONS

# A cell of a system at another site than the run's (mlcampaign.plan.runs).
OTHER_SITE = "other site"
CELL_STATUSES = ("ok", "partial", "failed", "not run", "expected", OTHER_SITE, "not supported")


def capability_matrix(frame: pd.DataFrame, unplanned: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per planned cell (system x benchmark x scale x precision), none dropped, and one per
    unplanned (system, benchmark) pair (``unplanned``: Campaign.unplanned_cells())."""
    per_status = pd.crosstab([frame[key] for key in [*CELL_KEYS, *CELL_COLUMNS]], frame["status"]).reindex(
        columns=["ok", "failed", NOT_RUN], fill_value=0
    )
    cells = per_status.rename(columns={NOT_RUN: "not_run"}).reset_index()
    cells.columns.name = None
    cells.insert(cells.columns.get_loc("ok"), "planned", cells[["ok", "failed", "not_run"]].sum(axis=1))
    cells["valid"] = (
        frame.groupby(CELL_KEYS)["valid"].sum().reindex(pd.MultiIndex.from_frame(cells[CELL_KEYS])).to_numpy()
    )
    failures = frame.loc[frame["status"] == "failed"]
    reasons = failures.groupby([*CELL_KEYS, "failure_reason"], sort=False).size().reset_index(name="count")
    reasons = reasons.sort_values([*CELL_KEYS, "count", "failure_reason"], ascending=[True] * 3 + [False, True])
    reasons["text"] = reasons["failure_reason"].map(FAILURE_REASONS).fillna(reasons["failure_reason"]) + np.where(
        reasons["count"] > 1, " x" + reasons["count"].astype(str), ""
    )
    reason_text = reasons.groupby(CELL_KEYS, sort=False)["text"].agg(", ".join)
    cells["failure_reasons"] = reason_text.reindex(pd.MultiIndex.from_frame(cells[CELL_KEYS]), fill_value="").to_numpy()
    cells["status"] = "partial"
    cells.loc[cells["ok"] == cells["planned"], "status"] = "ok"
    cells.loc[(cells["ok"] == 0) & (cells["failed"] > 0), "status"] = "failed"
    cells.loc[cells["not_run"] == cells["planned"], "status"] = NOT_RUN
    cells["outcome"] = [_outcome(row) for row in cells.itertuples()]
    if unplanned is not None and len(unplanned):
        # Unplanned pairs have no layout: their processes are missing, the others stay integers.
        cells = pd.concat([cells, unplanned_rows(unplanned)], ignore_index=True).astype({"processes": "Int64"})
    return cells.sort_values([*CELL_KEYS]).reset_index(drop=True)


def unplanned_rows(unplanned: pd.DataFrame) -> pd.DataFrame:
    """Capability rows of unplanned pairs: no trial planned, the outcome says why, e.g.
    "expected: out of memory (published)", "not supported: no launcher: ..." or, for a system of
    another site than the run's, "not run at this site: runs at site cirrus"."""
    expected = unplanned["expected_outcome"].notna()
    elsewhere = ~expected & unplanned["runnable"].astype(bool)
    labels = unplanned["expected_outcome"].map(FAILURE_REASONS).fillna(unplanned["expected_outcome"])
    return pd.DataFrame(
        {
            **{key: unplanned[key] for key in CELL_KEYS},
            **{count: 0 for count in ("planned", "ok", "failed", "not_run", "valid")},
            "failure_reasons": "",
            "status": np.select([expected, elsewhere], ["expected", OTHER_SITE], "not supported"),
            "outcome": np.select(
                [expected, elsewhere],
                ["expected: " + labels + " (published)", "not run at this site: " + unplanned["detail"]],
                "not supported: " + unplanned["detail"],
            ),
        }
    )


def _outcome(cell) -> str:
    """A short human-readable verdict, e.g. 'failed: out of memory' or 'partial: 2/3 ok, not run x1'."""
    if cell.status == "ok":
        return "ok"
    if cell.status == NOT_RUN:
        return NOT_RUN
    parts = [cell.failure_reasons] if cell.failure_reasons else []
    if cell.not_run:
        parts.append(f"not run x{cell.not_run}")
    if cell.status == "partial":
        parts.insert(0, f"{cell.ok}/{cell.planned} ok")
    return f"{cell.status}: " + ", ".join(parts)


def campaign_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Planned / executed (a record exists) / ok / failed / not run / valid (ok and reached the
    target) / contended (ok, but its timing was disturbed) trials per system x benchmark, and a total
    row ("all", "all")."""
    counts = frame.assign(
        planned=1,
        executed=frame["status"] != NOT_RUN,
        ok=frame["status"] == "ok",
        failed=frame["status"] == "failed",
        not_run=frame["status"] == NOT_RUN,
        contended=(frame["status"] == "ok") & frame["contended"].fillna(False).astype(bool),
    )
    columns = ["planned", "executed", "ok", "failed", "not_run", "valid", "contended"]
    per_pair = counts.groupby(["system", "benchmark"], sort=True)[columns].sum().reset_index()
    total = pd.DataFrame([{"system": "all", "benchmark": "all", **counts[columns].sum().to_dict()}])
    summary = pd.concat([per_pair, total], ignore_index=True)
    summary[columns] = summary[columns].astype(int)
    summary["valid_fraction"] = summary["valid"] / summary["planned"]
    return summary
