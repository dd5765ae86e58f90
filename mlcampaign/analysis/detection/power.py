"""Calibration and power of the per-run test: its per-test level, calibrated by simulating the (pivotal)
null once per configuration so that the chance of a false alarm at one run, over every candidate start
and both directions, is ``false_alarm_rate``; the smallest change a cell detects with the configured
power, and the runs or trials per run that the target change needs."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
import scipy.optimize
import scipy.special
import scipy.stats

from mlcampaign.analysis.detection.run_values import Noise, centre_variance_factor
from mlcampaign.analysis.detection.settings import DEFAULT_SETTINGS, DetectionSettings


@functools.lru_cache(maxsize=64)
def _outlier_criticals(largest: int, alpha: float) -> np.ndarray:
    """For 0..largest runs: the Bonferroni critical value of the studentized deleted residual (inf
    below 5 runs, where none is left out)."""
    return np.array([t_quantile(size - 2, alpha / (2 * size)) if size >= 5 else np.inf for size in range(largest + 1)])


def robust_reference(reference: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of ``reference`` (rows x runs, NaN where a row has fewer runs): count, mean and sum of
    squares of the runs, the single most extreme run left out when its studentized deleted residual is
    significant at ``alpha`` (Bonferroni over the row's runs; from 5 runs on). The calibration uses
    this very function, so it covers the leaving out."""
    present = ~np.isnan(reference)
    size = present.sum(axis=1)
    total = np.where(present, reference, 0.0).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = total / size
    residual = np.where(present, reference - mean[:, None], 0.0)
    squares = (residual**2).sum(axis=1)
    count = size.copy()
    if not alpha or not (size >= 5).any():
        return count, mean, squares
    # Leaving run i out: the others' sum of squares and the residual of i against their mean.
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = (size / (size - 1))[:, None]
        others = squares[:, None] - residual**2 * factor
        deleted = np.abs(residual) * factor / np.sqrt(others / (size - 2)[:, None] * factor)
    deleted = np.where(present & np.isfinite(deleted), deleted, -np.inf)
    worst = np.argmax(deleted, axis=1)
    critical = _outlier_criticals(int(size.max()), alpha)[size]
    rows = np.flatnonzero(deleted[np.arange(len(size)), worst] > critical)
    if len(rows):
        count[rows] = size[rows] - 1
        mean[rows] = (total[rows] - reference[rows, worst[rows]]) / (size[rows] - 1)
        squares[rows] = others[rows, worst[rows]]
    return count, mean, squares


def p_two_sided(t, df):
    """Two-sided p of Student's t (scipy.special: the distribution objects cost ~50 us a call)."""
    return 2 * scipy.special.stdtr(df, -np.abs(t))


@functools.lru_cache(maxsize=4096)
def t_quantile(df: float, upper_tail: float) -> float:
    """Student's t quantile with ``upper_tail`` above it."""
    return float(scipy.special.stdtrit(df, 1 - upper_tail))


@functools.lru_cache(maxsize=512)
def _null_min_p(reference_sizes: tuple[int, ...], outlier_alpha: float, draws: int, seed: int) -> np.ndarray:
    """Sorted null distribution of the smallest per-test p over the candidate starts (newest run
    first), for iid normal run values. The statistic is location-scale invariant (pivotal): this holds
    whatever the cell's level and noise."""
    span = max(k + size for k, size in enumerate(reference_sizes, start=1))
    values = np.random.default_rng([seed, *reference_sizes]).standard_normal((draws, span))
    smallest = np.ones(draws)
    for k, size in enumerate(reference_sizes, start=1):
        count, mean, squares = robust_reference(values[:, span - k - size : span - k], outlier_alpha)
        new = values[:, span - k :]
        new_mean = new.mean(axis=1)
        squares = squares + ((new - new_mean[:, None]) ** 2).sum(axis=1)
        df = count + k - 2
        t = (new_mean - mean) / np.sqrt(squares / df * (1 / count + 1 / k))
        smallest = np.minimum(smallest, p_two_sided(t, df))
    return np.sort(smallest)


def null_of(reference_sizes: tuple[int, ...], settings: DetectionSettings) -> np.ndarray:
    """The calibration's null distribution (``_null_min_p``) for these settings."""
    return _null_min_p(reference_sizes, settings.reference_outlier_alpha, settings.calibration_draws, settings.seed)


@functools.lru_cache(maxsize=4096)
def _per_test_level(reference_sizes: tuple[int, ...], settings: DetectionSettings) -> float:
    return float(np.quantile(null_of(reference_sizes, settings), settings.false_alarm_rate))


def per_test_level(reference_sizes: Sequence[int], settings: DetectionSettings = DEFAULT_SETTINGS) -> float:
    """The per-test p threshold that makes the chance of a false alarm at a run
    ``settings.false_alarm_rate``, given the reference runs of each candidate start (newest first)."""
    return _per_test_level(tuple(int(size) for size in reference_sizes), settings)


@functools.lru_cache(maxsize=4096)
def noncentrality(df: int, critical: float, power: float) -> float:
    """Noncentrality at which a two-sided t test (critical value, df) rejects with ``power``."""

    def excess(nc: float) -> float:
        rejected = scipy.stats.nct.sf(critical, df, nc) + scipy.stats.nct.cdf(-critical, df, nc)
        return 1.0 - power if math.isnan(rejected) else rejected - power  # NaN far in the tail: power ~1

    high = critical + 10.0
    while excess(high) < 0:
        high *= 2
    return float(scipy.optimize.brentq(excess, 0.0, high))


@functools.lru_cache(maxsize=4096)
def _detectable_shift_per_sd(reference: int, new_runs: int, settings: DetectionSettings) -> float:
    """Shift of the run value, in run sds, that the test detects with ``settings.power`` when every
    candidate start has ``reference`` runs."""
    level = per_test_level((reference,) * (settings.confirmation + 1), settings)
    df = reference + new_runs - 2
    return noncentrality(df, t_quantile(df, level / 2), settings.power) * math.sqrt(1 / reference + 1 / new_runs)


def detectable_change(
    run_sd: float, reference: int, new_runs: int, settings: DetectionSettings = DEFAULT_SETTINGS
) -> float:
    """Smallest change (relative on the log scale, absolute on the linear) that the test of ``new_runs``
    runs against ``reference`` runs detects with ``settings.power``, for a run-value sd ``run_sd``."""
    if math.isnan(run_sd) or reference < settings.min_reference_runs:
        return math.nan
    shift = _detectable_shift_per_sd(reference, new_runs, settings) * run_sd
    return math.expm1(shift) if settings.scale == "log" else shift


@functools.lru_cache(maxsize=64)
def _variance_factors(largest: int, k: float) -> np.ndarray:
    """centre_variance_factor for 0..largest trials (index 0 unused)."""
    return np.array([np.nan, *(centre_variance_factor(trials, k) for trials in range(1, largest + 1))])


def _run_sds(noise: Noise, settings: DetectionSettings) -> np.ndarray:
    """Run sd with 1..max_trials trials per run. When the history shows week-level noise (its F test at
    5 %): that part, and the within-run part of a run value of that many trials. Otherwise the measured
    run sd is taken as trial noise alone and scaled to that many trials: a noisy estimate of a
    between-run part must not claim that more trials cannot help."""
    factors = _variance_factors(max(settings.max_trials, round(noise.trials_per_run)), settings.huber_k)
    if noise.between_p < 0.05:
        within = 0.0 if math.isnan(noise.within_sd) else noise.within_sd
        return np.sqrt(noise.between_sd**2 + factors[1 : settings.max_trials + 1] * within**2)
    usual = max(1, round(noise.trials_per_run))
    return noise.run_sd * np.sqrt(factors[1 : settings.max_trials + 1] / factors[usual])


@functools.lru_cache(maxsize=256)
def _shifts(new_runs: int, settings: DetectionSettings) -> np.ndarray:
    """Detectable shift per run sd for 0..window reference runs (NaN below min_reference_runs)."""
    return np.array(
        [
            _detectable_shift_per_sd(size, new_runs, settings) if size >= settings.min_reference_runs else np.nan
            for size in range(settings.window + 1)
        ]
    )


def trials_needed(noise: Noise, settings: DetectionSettings = DEFAULT_SETTINGS) -> int | None:
    """Fewest trials per run with which ``target_change`` is detectable within the confirmation window
    at a full window, at the measured noise; None when no number of trials gets there (the between-run,
    week-level noise alone is too large: only a quieter system helps). The between-run part counts only
    when significant (``Noise.between_p`` < 0.05)."""
    if math.isnan(noise.run_sd):
        return None
    shift = _shifts(settings.confirmation + 1, settings)[settings.window]
    run_sds = _run_sds(noise, settings)
    changes = np.expm1(shift * run_sds) if settings.scale == "log" else shift * run_sds
    enough = np.flatnonzero(changes <= settings.target_change)
    return int(enough[0]) + 1 if len(enough) else None


def runs_needed(run_sd: float, reference: int, settings: DetectionSettings = DEFAULT_SETTINGS) -> int | None:
    """More reference runs needed (0: none) for ``target_change`` to be detectable within the
    confirmation window at this run sd; None when even a full window is not enough."""
    if math.isnan(run_sd):
        return None
    sizes = np.arange(max(reference, settings.min_reference_runs), settings.window + 1)
    shifts = _shifts(settings.confirmation + 1, settings)[sizes] * run_sd
    changes = np.expm1(shifts) if settings.scale == "log" else shifts
    enough = np.flatnonzero(changes <= settings.target_change)
    return max(0, int(sizes[enough[0]]) - reference) if len(enough) else None
