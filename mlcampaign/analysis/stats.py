"""Statistics of groups of trials: descriptive statistics, confidence intervals, variance components.

Everything is vectorised over groups (a group is usually one cell: system x benchmark x scale x
precision) because a campaign may hold 100 000 trials. Conventions: standard deviations use
``ddof=1``; intervals are two-sided at ``confidence`` (e.g. 0.95); a statistic that is undefined
for a group (too few trials) is NaN, never a made-up number.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np
import pandas as pd
import scipy.stats


def coefficient_of_variation(std, mean):
    """std / |mean| (NaN where the mean is 0)."""
    std, mean = np.asarray(std, dtype=float), np.asarray(mean, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(mean != 0, std / np.abs(mean), np.nan)


def t_interval(mean, std, n, confidence: float):
    """Student-t interval of the mean from summary statistics (NaN where n < 2)."""
    mean, std, n = (np.asarray(x, dtype=float) for x in (mean, std, n))
    with np.errstate(divide="ignore", invalid="ignore"):
        dof = np.where(n >= 2, n - 1, np.nan)
        half = scipy.stats.t.ppf(0.5 + confidence / 2, dof) * std / np.sqrt(n)
    return mean - half, mean + half


def olympic_mean(total, minimum, maximum, n):
    """MLPerf's score: the mean after dropping the fastest and the slowest run (NaN where n < 3)."""
    total, minimum, maximum, n = (np.asarray(x, dtype=float) for x in (total, minimum, maximum, n))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(n >= 3, (total - minimum - maximum) / (n - 2), np.nan)


def wilson_interval(successes, n, confidence: float):
    """Wilson score interval of a proportion (NaN where n = 0)."""
    k, n = np.asarray(successes, dtype=float), np.asarray(n, dtype=float)
    z = scipy.stats.norm.ppf(0.5 + confidence / 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = k / n
        centre = (p + z**2 / (2 * n)) / (1 + z**2 / n)
        half = z / (1 + z**2 / n) * np.sqrt(p * (1 - p) / n + z**2 / (4 * n**2))
    return centre - half, centre + half


def describe(table: pd.DataFrame, by: Sequence[str], metrics: Sequence[str], confidence: float) -> pd.DataFrame:
    """Per group and metric: n, mean, median, std, CV, min, max, t interval, olympic mean.

    Long format: one row per (group, metric); NaN values of a metric are not counted.
    """
    grouped = table.groupby(list(by), sort=True, observed=True)[list(metrics)]
    aggregates = {name: getattr(grouped, name)() for name in ("count", "sum", "mean", "median", "std", "min", "max")}
    long = pd.concat({name: frame.stack(future_stack=True) for name, frame in aggregates.items()}, axis=1).rename(
        columns={"count": "n"}
    )
    long.index = long.index.set_names([*by, "metric"])
    long["cv"] = coefficient_of_variation(long["std"], long["mean"])
    long["ci_t_low"], long["ci_t_high"] = t_interval(long["mean"], long["std"], long["n"], confidence)
    long["olympic_mean"] = olympic_mean(long["sum"], long["min"], long["max"], long["n"])
    return long.drop(columns="sum")


def group_rng(seed: int, key) -> np.random.Generator:
    """The random generator of one group (cell): seeded from the campaign ``seed`` and the group's
    key, so that adding a system to a campaign does not change the draws of the other groups."""
    return np.random.default_rng([seed, zlib.crc32(repr(key).encode())])


def percentile_interval(samples: np.ndarray, confidence: float, axis: int = -1):
    """Percentile interval of bootstrap samples along ``axis``, ignoring NaN samples.

    Same values as ``np.nanpercentile`` (linear interpolation), vectorised over the other axes
    (one sort, faster here than ``np.quantile``'s partition).
    """
    ordered = np.sort(np.moveaxis(np.asarray(samples), axis, -1), axis=-1)  # NaN sort last
    last = np.maximum((~np.isnan(ordered)).sum(axis=-1) - 1, 0)
    bounds = []
    for quantile in (0.5 - confidence / 2, 0.5 + confidence / 2):
        position = quantile * last
        below = np.floor(position).astype(int)
        above = np.minimum(below + 1, last)
        low = np.take_along_axis(ordered, below[..., None], axis=-1)[..., 0]
        high = np.take_along_axis(ordered, above[..., None], axis=-1)[..., 0]
        bounds.append(low + (position - below) * (high - low))
    return bounds[0], bounds[1]


class CellBootstrap:
    """Bootstrap distributions of per-group means, for several metrics at once.

    Each group's trials are resampled with replacement ``n_resamples`` times; one resample draws
    the same trials for every metric. A trial whose value of a metric is NaN (e.g. time-to-train of
    a run that missed the target) is skipped for that metric, so the resampled mean is the mean over
    the drawn trials that have a value (NaN if none has).

    The generator of each group is seeded from ``seed`` and the group's key, so adding a system to
    a campaign does not change the intervals of the other groups.
    """

    def __init__(
        self,
        table: pd.DataFrame,
        by: Sequence[str],
        metrics: Sequence[str],
        n_resamples: int,
        seed: int,
    ):
        self.metrics = list(metrics)
        self._intervals: dict[float, tuple[np.ndarray, np.ndarray]] = {}
        grouped = table.groupby(list(by), sort=True, observed=True)
        sizes = grouped.size()
        self.keys = pd.MultiIndex.from_frame(sizes.index.to_frame(index=False))
        # Rows of group g are rows[starts[g]:starts[g] + sizes[g]].
        rows = np.argsort(grouped.ngroup().to_numpy(), kind="stable")
        starts = np.cumsum(sizes.to_numpy()) - sizes.to_numpy()
        values = table[self.metrics].to_numpy(dtype=float)
        # The sample means, and the resampled means as float32 deviations from them: half the
        # memory and a faster sort than float64, and exact where a group has one trial (deviation 0).
        # Metric-major, so that each metric's (groups, resamples) block is contiguous.
        self.centers = grouped[self.metrics].mean().to_numpy().T
        self.deviations = np.empty((len(self.metrics), len(sizes), n_resamples), dtype=np.float32)
        for group, (key, start, size) in enumerate(zip(self.keys, starts, sizes.to_numpy(), strict=True)):
            rng = group_rng(seed, key)
            means = self._resampled_means(values[rows[start : start + size]], n_resamples, rng)
            self.deviations[:, group, :] = (means - self.centers[:, group]).T

    @staticmethod
    def _resampled_means(values: np.ndarray, n_resamples: int, rng: np.random.Generator) -> np.ndarray:
        n = len(values)
        draws = rng.integers(0, n, size=(n_resamples, n))
        # How often each trial was drawn in each resample: means become two matrix products.
        counts = np.bincount((draws + n * np.arange(n_resamples)[:, None]).ravel(), minlength=n_resamples * n)
        counts = counts.reshape(n_resamples, n).astype(float)
        present = ~np.isnan(values)
        with np.errstate(divide="ignore", invalid="ignore"):
            return (counts @ np.where(present, values, 0.0)) / (counts @ present)

    def samples(self, metric: str) -> np.ndarray:
        """Resampled means of ``metric``: shape (groups, resamples), rows in ``self.keys`` order."""
        column = self.metrics.index(metric)
        return self.centers[column][:, None] + self.deviations[column]

    def interval(self, metric: str, confidence: float) -> pd.DataFrame:
        """Percentile interval of the mean of ``metric`` per group (columns ci_boot_low/high)."""
        if confidence not in self._intervals:  # all metrics at once: one pass over the samples
            low, high = percentile_interval(self.deviations, confidence)
            self._intervals[confidence] = (self.centers + low, self.centers + high)
        low, high = self._intervals[confidence]
        column = self.metrics.index(metric)
        return pd.DataFrame({"ci_boot_low": low[column], "ci_boot_high": high[column]}, index=self.keys)


def variance_components(table: pd.DataFrame, by: Sequence[str], unit: str, metrics: Sequence[str]) -> pd.DataFrame:
    """Split the variance of each metric into a between-seed and a within-seed (system noise) part.

    One-way random-effects ANOVA per group, with the seeded trial (``unit``) as the random factor
    and same-seed replicates as repeated measurements; unbalanced designs use the usual n0
    correction (Searle, Casella & McCulloch, Variance Components, 1992, section 3.6):

        MSB = sum_i n_i (mean_i - mean)^2 / (a - 1),  MSW = sum_ij (y_ij - mean_i)^2 / (N - a)
        n0 = (N - sum_i n_i^2 / N) / (a - 1)
        system noise variance = MSW,  seed variance = max(0, (MSB - MSW) / n0)

    NaN where it cannot be separated: fewer than two seeds, or no seed with two replicates.
    Returns one row per (group, metric) with columns seed_std and system_noise_std.
    """
    by = list(by)
    results = {}
    for metric in metrics:
        values = table[[*by, unit, metric]].dropna(subset=[metric])
        per_unit = values.groupby([*by, unit], sort=True, observed=True)[metric]
        unit_mean = per_unit.transform("mean")
        grand_mean = values.groupby(by, sort=True, observed=True)[metric].transform("mean")
        terms = values[by].assign(
            unit=values[unit],
            squared_within=(values[metric] - unit_mean) ** 2,
            # Summed over a seed's rows, these give n_i (mean_i - mean)^2 and n_i^2.
            squared_between=(unit_mean - grand_mean) ** 2,
            unit_size=per_unit.transform("size"),
        )
        sums = terms.groupby(by, sort=True, observed=True).agg(
            n=("unit_size", "size"),
            a=("unit", "nunique"),
            ss_within=("squared_within", "sum"),
            ss_between=("squared_between", "sum"),
            sum_n_squared=("unit_size", "sum"),
        )
        with np.errstate(divide="ignore", invalid="ignore"):
            ms_between = sums.ss_between / (sums.a - 1)
            ms_within = sums.ss_within / (sums.n - sums.a)
            n0 = (sums.n - sums.sum_n_squared / sums.n) / (sums.a - 1)
            seed_variance = np.maximum(0.0, (ms_between - ms_within) / n0)
        separable = (sums.a >= 2) & (sums.n > sums.a)
        results[metric] = pd.DataFrame(
            {
                "seed_std": np.sqrt(seed_variance.where(separable)),
                "system_noise_std": np.sqrt(ms_within.where(separable)),
            }
        )
    combined = pd.concat(results, names=["metric"])
    return combined.reorder_levels([*by, "metric"]).sort_index()
