"""The regression check: each cell of a run against the accepted baseline of that cell.

The monitoring use of a campaign (EPCC runs the same campaign after every system upgrade): the
baseline store (mlcampaign.analysis.baseline) keeps the per-trial samples of the last accepted run per
cell (system x benchmark x cell). The baseline is a reference *run*, judged as every run is
(mlcampaign.analysis.detection.reference_test, called by mlcampaign.history.verdicts for each run): the
run's value and the baseline's (Huber centres of their trials) differ by more than the cell's
run-to-run noise, measured from its history, allows at the campaign's false-alarm rate. Three
trials against three are never compared as independent samples: a run's trials share its week.

This module turns those verdicts of one run into the check's table and gate: one row per cell of
the run and system metric, with the cells the baseline lacks ("no baseline") and where each
baseline came from.
"""

from __future__ import annotations

import pandas as pd

from mlcampaign.analysis.frame import CELL_COLUMNS, CELL_KEYS

# Verdict against the baseline: what it means.
VERDICTS = {
    "regression": "worse than the baseline by more than the run-to-run noise allows at the false-alarm rate",
    "improvement": "better than the baseline by more than the run-to-run noise allows at the false-alarm rate",
    "unchanged": "within the run-to-run noise, and a change of the target size would have been found (90 % power)",
    "cannot tell yet": "too few runs of history to know the run-to-run noise, or too noisy for the target change",
    "not measured": "no ok trial of the cell in this run while the baseline has some",
    "no value": "ok trials, but none with a value of the metric (e.g. none reached the target)",
    "no baseline": "the baseline store has no accepted result for this cell",
}
# Verdicts that make `snakemake regression_check` fail.
GATING_VERDICTS = ("regression", "not measured")

# Columns of the baseline store that say where a cell's baseline came from: table column.
BASELINE_PROVENANCE = {
    "baseline_id": "baseline_id",
    "campaign": "baseline_campaign",
    "promoted_utc": "baseline_promoted_utc",
    "workflow_commit": "baseline_commits",
}
_COMPARED = ["verdict", "reason", "relative_change", "ci_low", "ci_high", "p_value", "smallest_detectable"]
_COMPARED += ["n", "value", "baseline_value", "detail"]
TABLE_COLUMNS = [*CELL_KEYS, *CELL_COLUMNS, "metric", "direction", *_COMPARED, *BASELINE_PROVENANCE.values()]


def regression_table(
    planned_trials: pd.DataFrame, against: pd.DataFrame, baseline: pd.DataFrame, metrics: list[str]
) -> pd.DataFrame:
    """One row per (cell of the run, metric) with its verdict against the baseline.

    ``planned_trials``: the run's planned_trials table (mlcampaign.analysis.frame); ``against``: the
    run's rows of the trends against the baseline (mlcampaign.history.trends.Trends.baseline);
    ``baseline``: the current rows of the baseline store (mlcampaign.analysis.baseline.current);
    ``metrics``: the system metrics judged."""
    cells = planned_trials.drop_duplicates(CELL_KEYS)[[*CELL_KEYS, *CELL_COLUMNS]].sort_values(CELL_KEYS)
    judged = {(*key, metric): row for (*key, metric), row in against.set_index([*CELL_KEYS, "metric"]).iterrows()}
    accepted = dict(list(baseline.groupby(CELL_KEYS, sort=False)))
    failures = planned_trials.loc[planned_trials["status"] != "ok"].groupby(CELL_KEYS, sort=False)["status"]
    # Why a cell has no ok trial, e.g. "failed x4, not run x1" (reasons: the capability table).
    outcomes = {key: ", ".join(f"{s} x{n}" for s, n in counts.value_counts().items()) for key, counts in failures}
    ok = dict(list(planned_trials.loc[planned_trials["status"] == "ok"].groupby(CELL_KEYS, sort=False)))
    rows = []
    for cell in cells.itertuples(index=False):
        key = tuple(getattr(cell, name) for name in CELL_KEYS)
        described = cell._asdict()
        reference = accepted.get(key)
        if reference is not None:
            described |= {name: _joined(reference[column]) for column, name in BASELINE_PROVENANCE.items()}
        for metric in metrics:
            row = described | {"metric": metric}
            if reference is None:
                row |= {"verdict": "no baseline", "detail": "no accepted result in the baseline store"}
            elif (*key, metric) in judged:
                row |= judged[(*key, metric)][["direction", *_COMPARED]].to_dict()
                if row["verdict"] == "not measured":
                    row["detail"] = f"no ok trial: {outcomes.get(key, 'none recorded')} (reasons: capability table)"
                elif key in ok:
                    row["detail"] += _batch_difference(ok[key], reference)
            else:
                row |= {"verdict": "not measured", "detail": f"no ok trial: {outcomes.get(key, 'none recorded')}"}
            rows.append(row)
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    table["verdict"] = pd.Categorical(table["verdict"], categories=list(VERDICTS))
    return table


def _batch_difference(trials: pd.DataFrame, accepted: pd.DataFrame) -> str:
    """A warning when the run ran the cell with another global batch than the baseline (e.g. a changed
    benchmark override): its throughput is then not like for like."""
    run, baseline = (
        ", ".join(f"{size:g}" for size in sorted(set(frame["global_batch_size"].dropna())))
        for frame in (trials, accepted)
    )
    if run == baseline:
        return ""
    return f"; not like for like: global batch {run} here, {baseline} in the baseline"


def _joined(values: pd.Series) -> str:
    """The distinct values of a provenance column, in order, joined with ', '."""
    return ", ".join(dict.fromkeys(str(value) for value in values.dropna()))


def gate_failures(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of a regression table that must fail the gate (GATING_VERDICTS)."""
    return table.loc[table["verdict"].isin(GATING_VERDICTS)]


def gate_message(table: pd.DataFrame) -> str:
    """What `snakemake regression_check` prints: the failing cells and metrics, one per line."""
    failures = gate_failures(table)
    lines = [
        f"  {row.system} {row.benchmark} {row.cell}: {row.metric} {row.verdict}"
        + (
            ""
            if pd.isna(row.relative_change)
            else f", {row.relative_change:+.1%} [{row.ci_low:+.1%}, {row.ci_high:+.1%}]"
        )
        + f" ({row.detail})"
        for row in failures.itertuples()
    ]
    cells = failures[CELL_KEYS].drop_duplicates()
    return f"{len(cells)} cell(s) regressed against the baseline ({len(failures)} metric(s)):\n" + "\n".join(lines)
