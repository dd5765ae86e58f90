"""Run values: each run's ok trials summarised into one value on the analysis scale (log for positive
metrics: changes are relative), their Huber M-estimate of location with the cell's pooled within-run
spread as its scale (as efficient as the mean when the trials agree, as robust as the median to one
slow trial out of three), and the noise of run values in its parts (trial to trial within a run, and
week-level between runs)."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import numpy as np
import scipy.special
import scipy.stats

from mlcampaign.analysis.detection.settings import DEFAULT_SETTINGS, DetectionSettings, Scale


@dataclasses.dataclass(frozen=True)
class RunSeries:
    """The trial values of one cell and metric, run by run: ``values`` is runs x trials on the analysis
    scale (``scale``), NaN-padded; a run without values is not measured."""

    values: np.ndarray
    scale: Scale

    @property
    def n(self) -> np.ndarray:
        return np.sum(~np.isnan(self.values), axis=1)


def run_series(trials: Sequence[Sequence[float] | None], scale: Scale = "log") -> RunSeries:
    """A RunSeries of the runs' trial values in order (None or an empty list: a run without values;
    NaN values, e.g. a trial that missed the target, are dropped)."""
    clean = [np.asarray([] if values is None else values, dtype=float) for values in trials]
    clean = [values[~np.isnan(values)] for values in clean]
    width = max([len(values) for values in clean] + [1])
    matrix = np.full((len(clean), width), np.nan)
    for position, values in enumerate(clean):
        if scale == "log":
            if np.any(values <= 0):
                raise ValueError(f"run {position}: the log scale needs positive values (use scale='linear')")
            values = np.log(values)
        matrix[position, : len(values)] = values
    return RunSeries(matrix, scale)


def scale_of(values: np.ndarray) -> Scale:
    """The analysis scale of a metric's values: log when every value is positive (relative changes)."""
    values = values[~np.isnan(values)]
    return "log" if len(values) and np.all(values > 0) else "linear"


def to_original(value: float, scale: Scale) -> float:
    return math.exp(value) if scale == "log" else value


def as_cv(sd: float, scale: Scale) -> float:
    """An sd on the analysis scale as a coefficient of variation (log scale), or as it is (linear)."""
    return math.expm1(sd) if scale == "log" else sd


def as_relative(diff: float, reference_level: float, scale: Scale) -> float:
    """A difference of run values as a change: relative (log scale), or over |reference_level| (linear)."""
    if scale == "log":
        return math.expm1(diff)
    return diff / abs(reference_level) if reference_level else math.nan


def huber_centres(values: np.ndarray, scale, k: float) -> np.ndarray:
    """Per row of ``values`` (runs x trials, NaN-padded): Huber's M-estimate of location with a known
    ``scale`` (one, or one per row: the pooled within-run sd, whose many degrees of freedom make it a
    constant here). The estimating equation sum psi((x - centre) / scale) = 0 is monotone and piecewise
    linear in the centre: Newton steps from the median, kept inside the bracket [min, max] by bisection,
    solve it exactly in a few steps. A scale of 0 or NaN (no within-run spread known) gives the median."""
    present = ~np.isnan(values)
    count = present.sum(axis=1)
    ordered = np.sort(values, axis=1)  # NaN last
    rows = np.arange(len(values))
    middle = np.maximum(count - 1, 0)
    centre = (ordered[rows, middle // 2] + ordered[rows, (middle + 1) // 2]) / 2
    scale = np.broadcast_to(np.asarray(scale, dtype=float), (len(values),))
    usable = (scale > 0) & (count > 1)
    if not usable.any():
        return centre
    present, scale, solved = present[usable], scale[usable], centre[usable]
    low, high = ordered[usable, 0], ordered[rows[usable], middle[usable]]
    filled = np.where(present, values[usable], 0.0)
    for _ in range(60):
        residual = np.where(present, (filled - solved[:, None]) / scale[:, None], 0.0)
        total = np.clip(residual, -k, k).sum(axis=1)
        inside = (present & (np.abs(residual) < k)).sum(axis=1)
        low = np.where(total > 0, solved, low)
        high = np.where(total < 0, solved, high)
        with np.errstate(divide="ignore", invalid="ignore"):
            newton = solved + scale * total / inside
        step = np.where((inside > 0) & (newton >= low) & (newton <= high), newton, (low + high) / 2)
        step = np.where(total == 0, solved, step)
        done = np.all(np.abs(step - solved) <= 1e-12 * scale)
        solved = step
        if done:
            break
    centre[usable] = solved
    return centre


@functools.lru_cache(maxsize=256)
def centre_variance_factor(n: int, k: float) -> float:
    """Var(run value of n normal trials) / sigma**2 for the Huber centre with a known scale: 1 and 1/2
    (the mean) for 1 and 2 trials, a fixed-seed simulation up to 10 (0.35 for 3), the asymptotic
    E[psi^2] / E[psi']^2 / n beyond. The price of a run value that trials_needed trades against
    more trials."""
    if n <= 2:
        return 1.0 / max(n, 1)
    if n <= 10:
        draws = np.random.default_rng(n).standard_normal((20_000, n))
        return float(np.var(huber_centres(draws, 1.0, k)))  # Monte-Carlo SE ~1 %: a planning figure
    inside = 2 * scipy.special.ndtr(k) - 1
    density = math.exp(-(k**2) / 2) / math.sqrt(2 * math.pi)
    return (inside - 2 * k * density + k**2 * (1 - inside)) / inside**2 / n


@functools.lru_cache(maxsize=64)
def _chi2_ratios(largest: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For degrees of freedom 0..largest: the chi-square median, 99 % quantile and mean below that
    quantile, each over the degrees of freedom (index 0 unused)."""
    dof = np.arange(1, largest + 1)
    cut = scipy.stats.chi2.ppf(0.99, dof)
    ratios = (scipy.stats.chi2.median(dof) / dof, cut / dof, scipy.stats.chi2.cdf(cut, dof + 2) / 0.99)
    return tuple(np.concatenate([[np.nan], ratio]) for ratio in ratios)


def row_medians(matrix: np.ndarray) -> np.ndarray:
    """The median of each row's non-NaN values (NaN for a row without any): np.nanmedian's result, without
    its cost on many short rows."""
    present = (~np.isnan(matrix)).sum(axis=1)
    if not matrix.shape[1]:
        return np.full(len(matrix), np.nan)
    ordered = np.sort(matrix, axis=1)  # NaN last
    rows = np.arange(len(matrix))
    low, high = np.maximum(present - 1, 0) // 2, np.maximum(present, 1) // 2
    return np.where(present > 0, (ordered[rows, low] + ordered[rows, high]) / 2, np.nan)


def within_sds(n: np.ndarray, variance: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of runs (``n`` trials and their ``variance``, NaN below 2 trials or outside the row's
    runs): the pooled within-run sd, robust to runs with a slow trial, and its degrees of freedom. A
    first estimate from the median of the runs' scaled variances, then the pooled variance of the runs
    whose variance is below the 99 % chi-square quantile of that estimate, corrected for the truncation
    (E[chi2_v / v | below it] = P(chi2_{v+2} <= cut) / 0.99). NaN for a row without spread."""
    spread = ~np.isnan(variance)
    dof = np.where(spread, n - 1, 0).astype(int)
    median_ratio, upper_ratio, truncated = _chi2_ratios(max(int(dof.max(initial=0)), 1))
    first = row_medians(variance / median_ratio[dof])  # rows without spread: NaN, said so below
    kept = spread & (variance <= upper_ratio[dof] * first[:, None])
    pooled_dof = np.where(kept, dof, 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        pooled = np.where(kept, dof * variance, 0).sum(axis=1) / np.where(kept, dof * truncated[dof], 0).sum(axis=1)
    sd = np.where(first > 0, np.sqrt(pooled), np.where(first == 0, 0.0, np.nan))
    return sd, np.where(first > 0, pooled_dof.sum(axis=1), dof.sum(axis=1))


def within_sd(n: np.ndarray, spread: np.ndarray) -> tuple[float, int]:
    """``within_sds`` of one set of runs, given their trial counts and sds."""
    sd, dof = within_sds(np.asarray(n)[None, :], np.asarray(spread, dtype=float)[None, :] ** 2)
    return float(sd[0]), int(dof[0])


@dataclasses.dataclass(frozen=True)
class MeasuredRuns:
    """The measured runs of a stretch of a series: positions, trial counts, Huber centres, spreads and
    the smallest and largest trial value, on the analysis scale."""

    position: np.ndarray
    n: np.ndarray
    value: np.ndarray
    spread: np.ndarray
    low: np.ndarray
    high: np.ndarray
    scale: float  # the Huber scale used: the robust pooled within-run sd of these runs

    @classmethod
    def of(cls, series: RunSeries, start: int, stop: int, k: float) -> MeasuredRuns:
        """The measured runs among positions start..stop - 1, centred with their own within-run sd."""
        values = series.values[start:stop]
        n = np.sum(~np.isnan(values), axis=1)
        measured = n > 0
        values, n = values[measured], n[measured]
        squares = np.nansum((values - np.nanmean(values, axis=1, keepdims=True)) ** 2, axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            spread = np.where(n >= 2, np.sqrt(squares / (n - 1)), np.nan)
        low, high = np.nanmin(values, axis=1), np.nanmax(values, axis=1)
        scale, _ = within_sd(n, spread)
        position = np.arange(start, stop)[measured]
        return cls(position, n, huber_centres(values, scale, k), spread, low, high, scale)


def run_values(series: RunSeries, settings: DetectionSettings = DEFAULT_SETTINGS) -> np.ndarray:
    """Each run's value on the analysis scale (NaN where not measured), centred with the within-run sd of
    the whole series (as the analysis of its last run sees them)."""
    runs = MeasuredRuns.of(series, 0, len(series.values), settings.huber_k)
    values = np.full(len(series.values), np.nan)
    values[runs.position] = runs.value
    return values


@dataclasses.dataclass(frozen=True)
class Noise:
    """A cell's noise on the analysis scale (log: an sd of 0.03 is a coefficient of variation of ~3 %).

    ``within_sd``: trial to trial within a run (robust pooled); ``run_sd``: sd of the run values, what a
    change is judged against, with ``run_df`` degrees of freedom; ``between_sd``: its part shared by a
    run's trials (week-level), ``run_sd**2 - v(n) * within_sd**2`` floored at 0, v(n) the variance
    factor of a run value of n trials; ``between_p``: p of an F test of that excess; ``left_out``:
    reference runs left out as outlying.
    """

    runs: int
    trials_per_run: float
    within_sd: float
    run_sd: float
    run_df: int
    between_sd: float
    between_p: float
    left_out: int = 0


def noise_of(
    runs: int, typical: float, within: float, within_dof: int, run_sd: float, run_df: int, used: int, factor: float
) -> Noise:
    """The Noise of a reference window from its statistics (``runs`` in reach, ``used`` of them, the run
    sd with ``run_df`` degrees of freedom): the between-run part is what the run values' variance has
    beyond the within-run part that reaches a run value (``factor``: the mean variance factor of its
    runs' values), with the p of an F test of that excess."""
    between, between_p = math.nan, math.nan
    if not math.isnan(run_sd):
        between = math.sqrt(max(0.0, run_sd**2 - factor * (0.0 if math.isnan(within) else within**2)))
        if within_dof and within > 0:
            between_p = float(scipy.special.fdtrc(run_df, within_dof, run_sd**2 / (factor * within**2)))
    return Noise(runs, typical, within, run_sd, run_df, between, between_p, runs - used)
