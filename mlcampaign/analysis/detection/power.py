"""Calibration and power of the per-run test: its per-test level, calibrated by simulating the (pivotal)
null once per configuration (the segments of each candidate start's reference runs; fixed seed, cached)
so that the chance of a false alarm at one run, over every candidate start and both directions, is the
per-run test's share of ``false_alarm_rate``; the smallest change a cell detects with the configured
power, and the runs or trials per run that the target change needs."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
import scipy.optimize
import scipy.stats

from mlcampaign.analysis.detection.run_values import Noise, centre_variance_factor
from mlcampaign.analysis.detection.settings import DEFAULT_SETTINGS, DetectionSettings
from mlcampaign.analysis.detection.statistic import candidate_tests, t_quantile

# The segments of a candidate's reference runs, oldest first, as their runs (one segment: (runs,)); a
# Structure has one per candidate start, newest run first.
Segments = tuple[int, ...]
Structure = tuple[Segments, ...]


@functools.lru_cache(maxsize=2048)
def _null_min_p(structure: Structure, outlier_alpha: float, draws: int, seed: int) -> np.ndarray:
    """Sorted null distribution of the smallest per-test p over the candidate starts (newest run first),
    for iid normal run values within each segment. The statistic is invariant to each segment's level
    and to the scale (pivotal): this holds whatever the cell's levels and noise."""
    span = max(k + sum(segments) for k, segments in enumerate(structure, start=1))
    flat = [runs for segments in structure for runs in segments]
    values = np.random.default_rng([seed, *flat]).standard_normal((draws, span))
    smallest = np.ones(draws)
    for k, segments in enumerate(structure, start=1):
        width = sum(segments)
        labels = np.repeat(np.arange(len(segments)), segments)[None, :]
        tests = candidate_tests(values[:, span - k - width : span - k], labels, values[:, span - k :], outlier_alpha)
        smallest = np.minimum(smallest, tests.p)
    return np.sort(smallest)


def structure_of(references: Sequence) -> Structure:
    """A Structure from the references of the candidate starts, each as its segments' runs or as a
    number of runs (one segment)."""
    return tuple(
        (int(segments),) if np.isscalar(segments) else tuple(int(runs) for runs in segments) for segments in references
    )


def null_of(references: Sequence, settings: DetectionSettings) -> np.ndarray:
    """The calibration's null distribution (``_null_min_p``) for these references and settings."""
    return _null_min_p(
        structure_of(references), settings.reference_outlier_alpha, settings.calibration_draws, settings.seed
    )


@functools.lru_cache(maxsize=8192)
def _per_test_level(structure: Structure, settings: DetectionSettings) -> float:
    return float(np.quantile(null_of(structure, settings), settings.per_run_rate))


def per_test_level(references: Sequence, settings: DetectionSettings = DEFAULT_SETTINGS) -> float:
    """The per-test p threshold that makes the chance of a false alarm of the per-run test at a run
    ``settings.per_run_rate``, given the reference of each candidate start (newest first): its
    segments' runs, or a number of runs in one segment."""
    return _per_test_level(structure_of(references), settings)


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
def detectable_shift_per_sd(level_runs: int, reference_df: int, new_runs: int, level: float, power: float) -> float:
    """Shift of the run value, in run sds, that a candidate test of ``new_runs`` runs against a level of
    ``level_runs`` runs, with ``reference_df`` degrees of freedom of noise, detects at the per-test
    ``level`` with ``power``."""
    df = reference_df + new_runs - 1
    return noncentrality(df, t_quantile(df, level / 2), power) * math.sqrt(1 / level_runs + 1 / new_runs)


@functools.lru_cache(maxsize=4096)
def _detectable_shift_per_sd(reference: int, new_runs: int, settings: DetectionSettings) -> float:
    """``detectable_shift_per_sd`` when every candidate start has ``reference`` runs in one segment."""
    level = per_test_level((reference,) * (settings.confirmation + 1), settings)
    return detectable_shift_per_sd(reference, reference - 1, new_runs, level, settings.power)


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
