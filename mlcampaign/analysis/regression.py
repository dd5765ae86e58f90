"""Regression detection: each cell of a campaign against the accepted baseline of that cell.

The monitoring use of a campaign (EPCC runs the same campaign after every system upgrade): the
baseline store (mlcampaign.analysis.baseline) keeps the per-trial samples of the last accepted campaign per
cell (system x benchmark x cell, the cell naming scale, precision, compression, framework and
backend). For each cell and metric this module compares the campaign's ok trials with the
baseline's:

- effect size: ratio of medians, campaign / baseline, with a two-sample percentile bootstrap
  interval (each side resampled on its own, ``scipy.stats.bootstrap``);
- significance: two-sided Mann-Whitney U test (``scipy.stats.mannwhitneyu``; exact for small
  samples without ties), so that a change inside run-to-run noise is not flagged;
- verdict, direction-aware (throughput: higher is better; time to train: lower; quality: the
  benchmark's target direction): a change is a regression or an improvement only when it is
  significant (p < alpha) *and* at least ``min_relative_change`` (|ratio - 1|).

Medians and a rank test rather than means and a t test: one trial on a sick node should neither
make nor hide a regression. With n trials per side the exact test cannot give a p-value below
2 / C(2n, n) (0.1 for 3 vs 3, 0.029 for 4 vs 4, 0.008 for 5 vs 5): such cells are reported as
"insufficient samples", never as "unchanged".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import scipy.stats

from mlcampaign.analysis.frame import CELL_COLUMNS, CELL_KEYS
from mlcampaign.analysis.stats import group_rng
from mlcampaign.plan.metrics import COMPARABLE_METRICS

# Verdict: what it means ("not measured" as in the published-numbers comparison,
# mlcampaign.analysis.published, whose faster/slower are about time only).
VERDICTS = {
    "regression": "worse than the baseline: significant (p < alpha) and by at least the minimum relative change",
    "improvement": "better than the baseline: significant (p < alpha) and by at least the minimum relative change",
    "unchanged": "not significant, or smaller than the minimum relative change (within run-to-run noise)",
    "not measured": "no ok trial of the cell in this campaign (every trial failed) while the baseline has some",
    "no baseline": "the baseline store has no accepted result for this cell",
    "insufficient samples": "too few values on one side for the test to reach alpha (or fewer than min_trials)",
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


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """When a change counts (the campaign config's ``regression`` block)."""

    min_relative_change: float
    alpha: float
    confidence: float
    bootstrap_resamples: int
    min_trials: int

    @classmethod
    def from_config(cls, regression: Mapping) -> Thresholds:
        return cls(**{field.name: regression[field.name] for field in dataclasses.fields(cls)})


def median_ratio(new, baseline, axis: int = -1):
    """Ratio of medians, ``new`` / ``baseline`` (vectorised along ``axis``, for the bootstrap)."""
    return np.median(new, axis=axis) / np.median(baseline, axis=axis)


def median_ratio_interval(new, baseline, confidence: float, n_resamples: int, rng: np.random.Generator):
    """Two-sample percentile bootstrap interval of ``median_ratio`` (each sample resampled alone).

    Percentile rather than BCa: BCa's jackknife is unstable for medians of 3-10 values.
    """
    result = scipy.stats.bootstrap(
        (np.asarray(new, dtype=float), np.asarray(baseline, dtype=float)),
        median_ratio,
        n_resamples=n_resamples,
        vectorized=True,
        paired=False,
        confidence_level=confidence,
        method="percentile",
        rng=rng,
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def smallest_p_value(n_new: int, n_baseline: int) -> float:
    """The smallest two-sided p-value the exact Mann-Whitney test can give for these sample sizes
    (complete separation, no ties): 2 / C(n_new + n_baseline, n_new)."""
    return min(1.0, 2 / math.comb(n_new + n_baseline, n_new))


def compare_samples(
    new: np.ndarray,
    baseline: np.ndarray,
    higher_is_better: bool,
    thresholds: Thresholds,
    rng: np.random.Generator,
) -> dict:
    """Compare one metric of one cell: the campaign's values ``new`` against the baseline's.

    Returns the verdict with its numbers (n, medians, ratio and interval, p-value) and a ``detail``
    sentence saying why. NaN values (not measured, e.g. time to train of a run that missed the
    target) are dropped first.
    """
    new = np.asarray(new, dtype=float)
    baseline = np.asarray(baseline, dtype=float)
    new, baseline = new[~np.isnan(new)], baseline[~np.isnan(baseline)]
    result = {
        "n_baseline": len(baseline),
        "n_new": len(new),
        "baseline_median": float(np.median(baseline)) if len(baseline) else np.nan,
        "new_median": float(np.median(new)) if len(new) else np.nan,
        "ratio": np.nan,
        "ratio_ci_low": np.nan,
        "ratio_ci_high": np.nan,
        "relative_change": np.nan,
        "p_value": np.nan,
    }
    if min(len(new), len(baseline)) < thresholds.min_trials:
        detail = f"{len(new)} campaign vs {len(baseline)} baseline values; min_trials is {thresholds.min_trials}"
        return result | {"verdict": "insufficient samples", "detail": detail}
    if result["baseline_median"] == 0:
        return result | {"verdict": "insufficient samples", "detail": "baseline median is 0: no ratio"}
    result["ratio"] = result["new_median"] / result["baseline_median"]
    result["relative_change"] = result["ratio"] - 1
    result["ratio_ci_low"], result["ratio_ci_high"] = median_ratio_interval(
        new, baseline, thresholds.confidence, thresholds.bootstrap_resamples, rng
    )
    floor = smallest_p_value(len(new), len(baseline))
    if floor >= thresholds.alpha:
        detail = (
            f"{len(new)} vs {len(baseline)} values: the smallest possible Mann-Whitney p-value is {floor:.3g}, "
            f"not below alpha {thresholds.alpha:g}; run more trials"
        )
        return result | {"verdict": "insufficient samples", "detail": detail}
    result["p_value"] = float(scipy.stats.mannwhitneyu(new, baseline, alternative="two-sided").pvalue)
    change = f"median {result['relative_change']:+.1%}"
    if result["p_value"] >= thresholds.alpha:
        detail = f"{change}, p = {result['p_value']:.3g} not below alpha {thresholds.alpha:g}"
        return result | {"verdict": "unchanged", "detail": detail}
    if abs(result["relative_change"]) < thresholds.min_relative_change:
        detail = f"{change} (p = {result['p_value']:.3g}) within +/-{thresholds.min_relative_change:.0%}"
        return result | {"verdict": "unchanged", "detail": detail}
    better = (result["relative_change"] > 0) == higher_is_better
    detail = f"{change}, p = {result['p_value']:.3g}"
    return result | {"verdict": "improvement" if better else "regression", "detail": detail}


def regression_table(
    planned_trials: pd.DataFrame,
    baseline: pd.DataFrame,
    metrics: Sequence[str],
    thresholds: Thresholds,
    seed: int,
) -> pd.DataFrame:
    """One row per (campaign cell, metric) with its verdict against ``baseline``.

    ``planned_trials``: the campaign's planned_trials table (mlcampaign.analysis.frame); ``baseline``:
    the current samples of the baseline store (mlcampaign.analysis.baseline.current). Bootstrap generators
    are seeded from ``seed`` and the cell and metric.
    """
    columns = [*CELL_KEYS, *CELL_COLUMNS]
    cells = planned_trials.drop_duplicates(CELL_KEYS)[columns].sort_values(CELL_KEYS)
    ok = planned_trials.loc[planned_trials["status"] == "ok"]
    ok_groups = dict(list(ok.groupby(CELL_KEYS, sort=False)))
    failures = planned_trials.loc[planned_trials["status"] != "ok"].groupby(CELL_KEYS, sort=False)["status"]
    # Why a cell has no ok trial, e.g. "failed x4, not run x1" (reasons: the capability table).
    outcomes = {key: ", ".join(f"{s} x{n}" for s, n in counts.value_counts().items()) for key, counts in failures}
    baseline_groups = dict(list(baseline.groupby(CELL_KEYS, sort=False)))
    rows = []
    for cell in cells.itertuples(index=False):
        key = tuple(getattr(cell, name) for name in CELL_KEYS)
        trials = ok_groups.get(key, ok.iloc[:0])
        accepted = baseline_groups.get(key)
        # Direction of the quality metric: the campaign's records say it, else the baseline's.
        directions = [*trials["target_direction"], *([] if accepted is None else accepted["target_direction"])]
        target_direction = directions[0] if directions else None
        described = {name: getattr(cell, name) for name in columns}
        if accepted is not None:
            described |= {name: _joined(accepted[column]) for column, name in BASELINE_PROVENANCE.items()}
            batch_note = _batch_difference(trials, accepted)
        for metric in metrics:
            direction = COMPARABLE_METRICS[metric]
            direction = target_direction if direction == "target" else direction
            row = described | {"metric": metric, "direction": direction}
            if accepted is None:
                row |= {"verdict": "no baseline", "detail": "no accepted result in the baseline store"}
                row["n_new"] = int(trials[metric].notna().sum())
            elif trials.empty:
                detail = f"no ok trial: {outcomes[key]} (reasons: capability table)"
                row |= {"verdict": "not measured", "detail": detail}
                row["n_baseline"], row["n_new"] = int(accepted[metric].notna().sum()), 0
            else:
                rng = group_rng(seed, (*key, metric))
                row |= compare_samples(trials[metric], accepted[metric], direction == "higher", thresholds, rng)
                row["detail"] += batch_note
            rows.append(row)
    table = pd.DataFrame(rows, columns=_TABLE_COLUMNS)
    table["verdict"] = pd.Categorical(table["verdict"], categories=list(VERDICTS))
    for column in ("n_baseline", "n_new"):
        table[column] = table[column].astype("Int64")
    return table


def _batch_difference(trials: pd.DataFrame, accepted: pd.DataFrame) -> str:
    """A warning when the campaign ran the cell with another global batch than the baseline (e.g.
    a changed benchmark override): its throughput is then not like for like."""
    campaign, baseline = (
        ", ".join(f"{size:g}" for size in sorted(set(frame["global_batch_size"].dropna())))
        for frame in (trials, accepted)
    )
    if campaign == baseline:
        return ""
    return f"; not like for like: global batch {campaign} here, {baseline} in the baseline"


def _joined(values: pd.Series) -> str:
    """The distinct values of a provenance column, in order, joined with ', '."""
    return ", ".join(dict.fromkeys(str(value) for value in values.dropna()))


_TABLE_COLUMNS = [
    *CELL_KEYS,
    *CELL_COLUMNS,
    "metric",
    "direction",
    "verdict",
    "ratio",
    "ratio_ci_low",
    "ratio_ci_high",
    "relative_change",
    "p_value",
    "n_baseline",
    "n_new",
    "baseline_median",
    "new_median",
    "detail",
    *BASELINE_PROVENANCE.values(),
]


def gate_failures(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of a regression table that must fail the gate (GATING_VERDICTS)."""
    return table.loc[table["verdict"].isin(GATING_VERDICTS)]


def gate_message(table: pd.DataFrame) -> str:
    """What `snakemake regression_check` prints: the failing cells and metrics, one per line."""
    failures = gate_failures(table)
    lines = [
        f"  {row.system} {row.benchmark} {row.cell}: {row.metric} {row.verdict}"
        + ("" if pd.isna(row.ratio) else f", ratio {row.ratio:.3f} [{row.ratio_ci_low:.3f}, {row.ratio_ci_high:.3f}]")
        + f" ({row.detail})"
        for row in failures.itertuples()
    ]
    cells = failures[CELL_KEYS].drop_duplicates()
    return f"{len(cells)} cell(s) regressed against the baseline ({len(failures)} metric(s)):\n" + "\n".join(lines)
