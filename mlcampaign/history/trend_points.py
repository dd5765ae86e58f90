"""The trend points of a set of runs: one row per run, cell and metric for every run that ran the cell,
over the trials the trends use (ok ones, less those whose timing was disturbed unless
``regression.keep_contended``)."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from mlcampaign.analysis.frame import CELL_KEYS
from mlcampaign.analysis.stats import describe
from mlcampaign.plan.metrics import COMPARABLE_METRICS

POINT_KEYS = ["run_order", "run_id", *CELL_KEYS]


def _directions(trials: pd.DataFrame, metrics: Sequence[str]) -> pd.DataFrame:
    """Per cell and metric, which way is better ("target": the cell's records' target direction)."""
    targets = trials.dropna(subset=["target_direction"]).groupby(CELL_KEYS)["target_direction"].first()
    cells = trials[CELL_KEYS].drop_duplicates().merge(targets.reset_index(), on=CELL_KEYS, how="left")
    rows = []
    for metric in metrics:
        direction = COMPARABLE_METRICS[metric]
        rows.append(
            cells.assign(metric=metric, direction=cells["target_direction"] if direction == "target" else direction)
        )
    return pd.concat(rows, ignore_index=True).drop(columns="target_direction")


def used_trials(trials: pd.DataFrame, keep_contended: bool) -> pd.Series:
    """Which planned trials the trends use: ok ones, less those whose timing was disturbed (the
    record's contention.contended) unless ``keep_contended``."""
    used = trials["status"] == "ok"
    return used if keep_contended else used & ~is_contended(trials)


def is_contended(trials: pd.DataFrame) -> pd.Series:
    """Which trials' timing was disturbed (the record's contention.contended; unknown: not disturbed)."""
    return trials["contended"].fillna(False).astype(bool)


def trend_points(trials: pd.DataFrame, metrics: Sequence[str], confidence: float) -> pd.DataFrame:
    """One row per (run, cell, metric) for every run that ran the cell: ``ok_trials`` and ``contended``
    (ok trials whose timing was disturbed) of the cell in the run, then over its used trials
    (``trials["used"]``) n (values of the metric), mean, median, std, min, max and the t interval of
    the mean (``ci_low``, ``ci_high``; NaN where n < 2). The t interval rather than the bootstrap: a
    percentile bootstrap of 3-5 trials covers less than its nominal level."""
    stats = describe(trials.loc[trials["used"]], POINT_KEYS, metrics, confidence).reset_index()
    stats = stats.rename(columns={"ci_t_low": "ci_low", "ci_t_high": "ci_high"})
    ok = trials["status"] == "ok"
    groups = [trials[key] for key in POINT_KEYS]
    counts = pd.concat(
        {"ok_trials": ok.groupby(groups).sum(), "contended": (ok & is_contended(trials)).groupby(groups).sum()}, axis=1
    )
    grid = counts.reset_index().merge(_directions(trials, metrics), on=CELL_KEYS)
    points = grid.merge(stats, on=[*POINT_KEYS, "metric"], how="left")
    points["n"] = points["n"].fillna(0).astype(int)
    columns = [*POINT_KEYS, "metric", "direction", "ok_trials", "contended", "n", "mean", "median", "std", "min", "max"]
    points = points[[*columns, "ci_low", "ci_high"]]
    return points.sort_values([*CELL_KEYS, "metric", "run_order"]).reset_index(drop=True)
