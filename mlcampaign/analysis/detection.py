"""Change detection over the runs of one cell and one metric (docs/regression.md).

The run is the unit of a trend: a run's ok trials share its week (nodes, software stack, filesystem
load), so they are summarised into one value per run, on a log scale for positive metrics (changes are
relative): their Huber M-estimate of location, with the cell's pooled within-run spread as its scale
(as efficient as the mean when the trials agree, as robust as the median to one slow trial out of
three). The noise of run values comes from the history itself. Two detectors read the run series, and
both are reported:

- ``scan`` (per run): at each run, the newest run and the runs since a candidate start up to
  ``confirmation`` runs back, against the up to ``window`` preceding runs of the same segment. A
  two-sample t test on run values, so week-level variation shared by a run's trials is noise, not a
  change. Its per-test level is calibrated by simulating the (pivotal) null once per configuration, so
  that the chance of a false alarm at one run, over every candidate start and both directions, is
  ``false_alarm_rate``.
- ``history_changes`` (whole history): apache-otava's E-Divisive with a t test (split and merge,
  Fleming et al., ICPE 2023), re-run at every run, so that a change missed when it happened is found
  later and named by the run in which it started.

Also: the accepted baseline as a reference run (``reference_test``: the same error term), the smallest
change a cell detects with the configured power and the runs or trials per run that a target change
needs, and epochs to target judged one-sided in the manner of MLPerf's reference convergence points
(``convergence_test``, after mlperf-logging's rcp_checker).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import scipy.optimize
import scipy.special
import scipy.stats
from otava.analysis import compute_change_points

Direction = Literal["higher", "lower"]
Scale = Literal["log", "linear"]

# A run's verdict, and what it means.
VERDICTS = {
    "regression": "worse: the change is beyond the run-to-run noise at the stated false-alarm rate",
    "improvement": "better: the change is beyond the run-to-run noise at the stated false-alarm rate",
    "unchanged": "tested, nothing found, and a change of the target size would have been found (90 % power)",
    "cannot tell yet": "the history cannot decide (the reason says why and what it needs)",
    "not measured": "no ok trial of the cell in this run",
    "no value": "the cell has ok trials in this run but none with a value of the metric (e.g. none reached the target)",
}
# Why a run "cannot tell yet".
REASONS = {
    "insufficient history": "too few runs since the start of the series or of the last change to test",
    "underpowered": "tested and nothing found, but a change of the target size could have been missed",
    "awaiting confirmation": "the newest run looks off, not enough to alarm alone: the next runs decide",
    "inconsistent trials": "the newest run alone would alarm, but its trials disagree (or are fewer than usual)",
}
ALARMS = ("regression", "improvement")


@dataclasses.dataclass(frozen=True)
class DetectionSettings:
    """How the detectors decide (the campaign's ``regression`` block; defaults: weekly runs of about
    three trials, changes of 5 % and more)."""

    # Chance of a false alarm at one run of one cell (both directions, all candidate starts together).
    false_alarm_rate: float = 0.01
    # The change a cell should detect within the confirmation window, with ``power``.
    target_change: float = 0.05
    # At most this many preceding runs form the reference (12 weekly runs: a quarter).
    window: int = 12
    # A change may take this many following runs to be confirmed (candidate starts: the last 1 + this).
    confirmation: int = 3
    power: float = 0.9
    # No test with fewer reference runs (the t test needs a spread of run values).
    min_reference_runs: int = 3
    # The most extreme reference run is left out when its studentized deleted residual is significant
    # at this level (Bonferroni; from 5 reference runs on): one run with two slow trials out of three
    # must not mask a change for a whole window. 0: keep every run.
    reference_outlier_alpha: float = 0.01
    # Per-test p below which a newest run that does not alarm is "awaiting confirmation".
    suspect_p: float = 0.05
    # Huber's tuning constant (in within-run sds): 95 % efficiency at normal trials.
    huber_k: float = 1.345
    # "log": positive metrics, relative changes; "linear": any sign, absolute changes.
    scale: Scale = "log"
    # apache-otava's settings (its own defaults) for the whole-history detector.
    history_max_pvalue: float = 0.001
    history_window: int = 50
    # A history change point needs this many runs on each side: the newest run is the per-run test's
    # (with its gates), and one run between two change points is an outlying run, not two changes.
    history_min_segment: int = 2
    # Calibration of the per-test level: simulated null draws (Monte-Carlo SE of the rate ~0.05 %).
    calibration_draws: int = 40_000
    seed: int = 24
    # Largest trials per run that trials_needed considers.
    max_trials: int = 30

    @classmethod
    def from_config(cls, regression: Mapping) -> DetectionSettings:
        """The settings of a campaign's ``regression`` block (keys absent in older runs' configs: defaults)."""
        names = ("false_alarm_rate", "target_change", "window", "confirmation")
        return cls(**{name: regression[name] for name in names if name in regression})


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


@dataclasses.dataclass(frozen=True)
class StepResult:
    """The per-run test at one run (``scan``)."""

    run: int  # position of the run in the series
    verdict: str
    reason: str | None
    change_start: int | None  # position of the run in which the change started (alarms)
    new_runs: int  # runs in the tested new segment
    reference_runs: int
    relative_change: float  # new / reference - 1 (log scale); (new - reference) / |reference| (linear)
    ci_low: float
    ci_high: float
    interval_level: float  # 1 - per-test level: the interval excludes 0 exactly when the test alarms
    p_value: float  # of the reported test
    adjusted_p: float  # over all candidate starts of this run: compare with false_alarm_rate
    false_alarm_rate: float
    noise: Noise | None
    mde_first: float  # smallest change detected at the first changed run with the configured power
    mde_confirmed: float  # ... within the confirmation window
    runs_needed: int | None  # more runs before target_change is detectable (None: a full window is not enough)
    trials_needed: int | None  # trials per run for target_change at a full window (None: no number suffices)
    detail: str


@dataclasses.dataclass(frozen=True)
class HistoryChange:
    """A change point of the whole history: the run in which it started and the levels either side."""

    run: int  # position in the series of the run in which the change started
    before: float  # level before (original units; geometric mean of run values on the log scale)
    after: float
    relative_change: float
    p_value: float  # apache-otava's
    verdict: str  # regression / improvement
    first_found: int  # position of the first run whose analysis named it


@dataclasses.dataclass(frozen=True)
class ConvergenceResult:
    """One-sided test of epochs to target against the cell's history (``convergence_test``)."""

    verdict: str
    reference_runs: int
    reference_mean: float  # of the reference runs' olympic means (geometric on the log scale)
    new_mean: float
    new_trials: int
    max_acceptable: float
    max_slowdown: float
    relative_change: float
    p_value: float
    false_alarm_rate: float
    detail: str


# ---------------------------------------------------------------------------------------------------
# The run series


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


def _cv(sd: float, scale: Scale) -> float:
    """An sd on the analysis scale as a coefficient of variation (log scale), or as it is (linear)."""
    return math.expm1(sd) if scale == "log" else sd


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


def within_sds(n: np.ndarray, variance: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of runs (``n`` trials and their ``variance``, NaN below 2 trials or outside the row's
    runs): the pooled within-run sd, robust to runs with a slow trial, and its degrees of freedom. A
    first estimate from the median of the runs' scaled variances, then the pooled variance of the runs
    whose variance is below the 99 % chi-square quantile of that estimate, corrected for the truncation
    (E[chi2_v / v | below it] = P(chi2_{v+2} <= cut) / 0.99). NaN for a row without spread."""
    spread = ~np.isnan(variance)
    dof = np.where(spread, n - 1, 0).astype(int)
    median_ratio, upper_ratio, truncated = _chi2_ratios(max(int(dof.max(initial=0)), 1))
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # rows without spread: NaN, said so below
        first = np.nanmedian(variance / median_ratio[dof], axis=1)
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
class _Runs:
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
    def of(cls, series: RunSeries, start: int, stop: int, k: float) -> _Runs:
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


def run_values(series: RunSeries, settings: DetectionSettings = DetectionSettings()) -> np.ndarray:
    """Each run's value on the analysis scale (NaN where not measured), centred with the within-run sd of
    the whole series (as the analysis of its last run sees them)."""
    runs = _Runs.of(series, 0, len(series.values), settings.huber_k)
    values = np.full(len(series.values), np.nan)
    values[runs.position] = runs.value
    return values


# ---------------------------------------------------------------------------------------------------
# Noise, calibration and power


@functools.lru_cache(maxsize=64)
def _outlier_criticals(largest: int, alpha: float) -> np.ndarray:
    """For 0..largest runs: the Bonferroni critical value of the studentized deleted residual (inf
    below 5 runs, where none is left out)."""
    return np.array([_t_quantile(size - 2, alpha / (2 * size)) if size >= 5 else np.inf for size in range(largest + 1)])


def _robust_reference(reference: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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


def _p_two_sided(t, df):
    """Two-sided p of Student's t (scipy.special: the distribution objects cost ~50 us a call)."""
    return 2 * scipy.special.stdtr(df, -np.abs(t))


@functools.lru_cache(maxsize=4096)
def _t_quantile(df: float, upper_tail: float) -> float:
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
        count, mean, squares = _robust_reference(values[:, span - k - size : span - k], outlier_alpha)
        new = values[:, span - k :]
        new_mean = new.mean(axis=1)
        squares = squares + ((new - new_mean[:, None]) ** 2).sum(axis=1)
        df = count + k - 2
        t = (new_mean - mean) / np.sqrt(squares / df * (1 / count + 1 / k))
        smallest = np.minimum(smallest, _p_two_sided(t, df))
    return np.sort(smallest)


def _null_of(reference_sizes: tuple[int, ...], settings: DetectionSettings) -> np.ndarray:
    return _null_min_p(reference_sizes, settings.reference_outlier_alpha, settings.calibration_draws, settings.seed)


@functools.lru_cache(maxsize=4096)
def _per_test_level(reference_sizes: tuple[int, ...], settings: DetectionSettings) -> float:
    return float(np.quantile(_null_of(reference_sizes, settings), settings.false_alarm_rate))


def per_test_level(reference_sizes: Sequence[int], settings: DetectionSettings = DetectionSettings()) -> float:
    """The per-test p threshold that makes the chance of a false alarm at a run
    ``settings.false_alarm_rate``, given the reference runs of each candidate start (newest first)."""
    return _per_test_level(tuple(int(size) for size in reference_sizes), settings)


@functools.lru_cache(maxsize=4096)
def _noncentrality(df: int, critical: float, power: float) -> float:
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
    return _noncentrality(df, _t_quantile(df, level / 2), settings.power) * math.sqrt(1 / reference + 1 / new_runs)


def detectable_change(
    run_sd: float, reference: int, new_runs: int, settings: DetectionSettings = DetectionSettings()
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


def trials_needed(noise: Noise, settings: DetectionSettings = DetectionSettings()) -> int | None:
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


def runs_needed(run_sd: float, reference: int, settings: DetectionSettings = DetectionSettings()) -> int | None:
    """More reference runs needed (0: none) for ``target_change`` to be detectable within the
    confirmation window at this run sd; None when even a full window is not enough."""
    if math.isnan(run_sd):
        return None
    sizes = np.arange(max(reference, settings.min_reference_runs), settings.window + 1)
    shifts = _shifts(settings.confirmation + 1, settings)[sizes] * run_sd
    changes = np.expm1(shifts) if settings.scale == "log" else shifts
    enough = np.flatnonzero(changes <= settings.target_change)
    return max(0, int(sizes[enough[0]]) - reference) if len(enough) else None


# ---------------------------------------------------------------------------------------------------
# The per-run test


def _relative(diff: float, reference_level: float, scale: Scale) -> float:
    if scale == "log":
        return math.expm1(diff)
    return diff / abs(reference_level) if reference_level else math.nan


def _verdict_of(change: float, direction: Direction) -> str:
    return "improvement" if (change > 0) == (direction == "higher") else "regression"


def scan(
    series: RunSeries, direction: Direction, settings: DetectionSettings = DetectionSettings()
) -> list[StepResult]:
    """The per-run test at every run in order, as it runs each week (each run sees only the runs up
    to it): one StepResult per run. After an alarm the segment restarts at the run in which the change
    started (the new level is the new reference). The analyses of a segment are computed together
    (``_analyses``), again from the first alarm on with the segment restarted there."""
    settings = dataclasses.replace(settings, scale=series.scale)
    measured = np.flatnonzero(series.n > 0)
    tested: dict[int, StepResult] = {}
    first, start = 0, 0  # the segment's first measured run, and the first analysis not yet final
    while start < len(measured):
        results = _analyses(series, measured, first, start, direction, settings)
        alarm = next((number for number, result in enumerate(results) if result.verdict in ALARMS), None)
        final = results if alarm is None else results[: alarm + 1]
        tested |= {result.run: result for result in final}
        if alarm is None:
            break
        first = int(np.searchsorted(measured, results[alarm].change_start))
        start += alarm + 1
    undecided = "no value of the cell in this run"
    return [
        tested.get(position) or _undecided(position, "not measured", None, undecided, settings)
        for position in range(len(series.values))
    ]


def _analyses(
    series: RunSeries, measured: np.ndarray, first: int, start: int, direction: Direction, settings: DetectionSettings
) -> list[StepResult]:
    """The per-run test at measured runs start, start + 1, ... (indices into ``measured``), in a segment
    that begins at measured run ``first``, all at once: each analysis sees the up to window +
    confirmation + 1 runs of the segment up to it, as a row of ``span`` columns, the newest run last."""
    window, confirmation = settings.window, settings.confirmation
    span = window + confirmation + 1
    analysed = np.arange(start, len(measured))
    # Column c of analysis a holds measured run a - (span - 1 - c), when it is in the segment.
    offsets = np.arange(span) - (span - 1)
    index = analysed[:, None] + offsets[None, :]
    inside = index >= np.maximum(first, analysed - window - confirmation)[:, None]
    trials = series.values[measured[np.where(inside, index, 0)]]
    trials[~inside] = np.nan
    n = (~np.isnan(trials)).sum(axis=2)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.nansum(trials, axis=2) / n
        variance = np.where(n >= 2, np.nansum((trials - mean[..., None]) ** 2, axis=2) / (n - 1), np.nan)
    # The Huber scale of each analysis: the pooled within-run sd of its runs.
    scale, _ = within_sds(n, variance)
    values = huber_centres(trials.reshape(-1, trials.shape[2]), np.repeat(scale, span), settings.huber_k)
    values = values.reshape(len(analysed), span)
    # The reference window of the newest run (k = 1): its noise, and the runs the other candidates share.
    available = inside.sum(axis=1) - 1  # earlier runs of the segment in reach
    reference_now = np.minimum(window, available)
    candidates = []
    for k in range(1, confirmation + 2):
        size = np.minimum(window, available - k + 1)
        reference = values[:, span - k - window : span - k]
        count, level, reference_squares = _robust_reference(reference, settings.reference_outlier_alpha)
        new = values[:, span - k :]
        new_mean = new.mean(axis=1)
        squares = reference_squares + ((new - new_mean[:, None]) ** 2).sum(axis=1)
        df = count + k - 2
        with np.errstate(divide="ignore", invalid="ignore"):
            se = np.sqrt(squares / df * (1 / count + 1 / k))
            diff = new_mean - level
            t = np.where(se > 0, diff / se, np.where(diff == 0, 0.0, np.copysign(np.inf, diff)))
        p = _p_two_sided(t, df)
        candidates.append(
            {"k": k, "size": size, "used": count, "diff": diff, "se": se, "df": df, "p": p, "level": level}
            | {"reference_squares": reference_squares}
        )
    # The noise of each newest run's reference window (the runs before it, up to ``window``).
    before = inside & (offsets[None, :] < 0) & (offsets[None, :] >= -reference_now[:, None])
    within, within_dof = within_sds(np.where(before, n, 0), np.where(before, variance, np.nan))
    # Per analysis: the mean variance factor of its reference runs' values, and their median trials.
    table = np.array([np.nan, *(centre_variance_factor(trials, settings.huber_k) for trials in range(1, n.max() + 1))])
    reference_n = np.where(before, n, 0)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # analyses without reference runs: NaN, not used
        factor = np.nanmean(np.where(before, table[reference_n], np.nan), axis=1)
        typical = np.nanmedian(np.where(before, n, np.nan), axis=1)
    newest = n[:, -1]
    high = np.nanmax(np.where(inside[:, -1:, None], trials[:, -1:, :], -np.inf), axis=(1, 2))
    low = np.nanmin(np.where(inside[:, -1:, None], trials[:, -1:, :], np.inf), axis=(1, 2))
    results = []
    for row, position in enumerate(measured[analysed]):
        if reference_now[row] < settings.min_reference_runs:
            more = settings.min_reference_runs - int(reference_now[row])
            detail = (
                f"insufficient history: {int(reference_now[row])} earlier run(s) in this segment; the test needs "
                f"{settings.min_reference_runs} (needs {more} more run(s))"
            )
            results.append(_undecided(int(position), "cannot tell yet", "insufficient history", detail, settings, more))
            continue
        count = int(candidates[0]["used"][row])
        run_sd = math.sqrt(candidates[0]["reference_squares"][row] / (count - 1)) if count >= 2 else math.nan
        noise = _noise_of(
            int(reference_now[row]), typical[row], within[row], int(within_dof[row]), run_sd, count, factor[row]
        )
        tests = [
            {key: (value[row] if isinstance(value, np.ndarray) else value) for key, value in candidate.items()}
            for candidate in candidates
            if candidate["size"][row] >= settings.min_reference_runs
        ]
        for test in tests:
            test["start"] = int(measured[analysed[row] - test["k"] + 1])
        gate = _newest_run_gate(int(newest[row]), low[row], high[row], tests[0], noise)
        results.append(_decide(int(position), tests, gate, noise, int(reference_now[row]), direction, settings))
    return results


def _noise_of(
    runs: int, typical: float, within: float, within_dof: int, run_sd: float, count: int, factor: float
) -> Noise:
    """The Noise of a reference window from its statistics: the between-run part is what the run
    values' variance has beyond the within-run part that reaches a run value (``factor``: the mean
    variance factor of its runs' values), with the p of an F test of that excess."""
    between, between_p = math.nan, math.nan
    if not math.isnan(run_sd):
        between = math.sqrt(max(0.0, run_sd**2 - factor * (0.0 if math.isnan(within) else within**2)))
        if within_dof and within > 0:
            between_p = float(scipy.special.fdtrc(count - 1, within_dof, run_sd**2 / (factor * within**2)))
    return Noise(runs, typical, within, run_sd, count - 1, between, between_p, runs - count)


def _decide(
    run: int,
    tests: list[dict],
    gate: str,
    noise: Noise,
    reference_now: int,
    direction: Direction,
    settings: DetectionSettings,
) -> StepResult:
    """The verdict at one run from its candidate tests (newest run first)."""
    sizes = tuple(int(test["size"]) for test in tests)
    level = per_test_level(sizes, settings)
    context = {"sizes": sizes, "level": level, "noise": noise, "reference_runs": reference_now, "run": run}
    context["mde_first"] = detectable_change(noise.run_sd, reference_now, 1, settings)
    context["mde_confirmed"] = detectable_change(noise.run_sd, reference_now, settings.confirmation + 1, settings)
    newest = tests[0]
    rejected = [test for test in tests if test["p"] <= level and not (test["k"] == 1 and gate)]
    if rejected:
        best = min(rejected, key=lambda test: test["p"])
        return _tested(best, _verdict_of(best["diff"], direction), None, settings, context)
    if newest["p"] <= level:
        result = _tested(newest, "cannot tell yet", "inconsistent trials", settings, context)
        return dataclasses.replace(result, detail=f"the newest run alone cannot decide: {gate}; {result.detail}")
    if newest["p"] <= settings.suspect_p:
        return _tested(newest, "cannot tell yet", "awaiting confirmation", settings, context)
    if not context["mde_confirmed"] <= settings.target_change:
        return _tested(newest, "cannot tell yet", "underpowered", settings, context)
    return _tested(newest, "unchanged", None, settings, context)


def _newest_run_gate(n: int, low: float, high: float, newest: dict, noise: Noise) -> str:
    """Why the newest run alone cannot decide ('' if it can): it has fewer trials than usual, or its
    trial that moved least is not past halfway from the earlier level to the run's value (e.g. two
    slow trials out of three: the third still sits at the earlier level)."""
    if n < noise.trials_per_run:
        return f"{n} trial value(s), fewer than the usual {noise.trials_per_run:g}"
    halfway = newest["level"] + newest["diff"] / 2
    disagree = high > halfway if newest["diff"] < 0 else low < halfway
    if n >= 2 and disagree:
        return "its trials disagree: one is nearer the earlier level than the run's value"
    return ""


def _undecided(
    run: int, verdict: str, reason: str | None, detail: str, settings: DetectionSettings, runs_needed: int | None = None
) -> StepResult:
    nan = math.nan
    return StepResult(
        run=run,
        verdict=verdict,
        reason=reason,
        change_start=None,
        new_runs=0,
        reference_runs=0,
        relative_change=nan,
        ci_low=nan,
        ci_high=nan,
        interval_level=nan,
        p_value=nan,
        adjusted_p=nan,
        false_alarm_rate=settings.false_alarm_rate,
        noise=None,
        mde_first=nan,
        mde_confirmed=nan,
        runs_needed=runs_needed,
        trials_needed=None,
        detail=detail,
    )


def _tested(test: dict, verdict: str, reason: str | None, settings: DetectionSettings, context: dict) -> StepResult:
    """The StepResult of the candidate ``test`` (k, size, used, diff, se, df, p, level, start)."""
    level = context["level"]
    half = _t_quantile(float(test["df"]), level / 2) * float(test["se"])
    diff = float(test["diff"])
    relative, low, high = (
        _relative(value, float(test["level"]), settings.scale) for value in (diff, diff - half, diff + half)
    )
    null = _null_of(context["sizes"], settings)
    adjusted = float(np.searchsorted(null, test["p"], side="right") / len(null))
    start, run = int(test["start"]), context["run"]
    noise = context["noise"]
    more_runs = runs_needed(noise.run_sd, context["reference_runs"], settings)
    more_trials = trials_needed(noise, settings)
    left_out = int(test["size"]) - int(test["used"])
    against = f"{int(test['used'])} earlier run(s)" + (f" ({left_out} outlying left out)" if left_out else "")
    change = (
        f"{relative:+.1%} [{low:+.1%}, {high:+.1%}]"
        if settings.scale == "log"
        else f"{relative:+.3g} [{low:+.3g}, {high:+.3g}]"
    )
    text = (
        f"{test['k']} run(s) from this one vs {against}: {change}, p = {test['p']:.2g} "
        f"(adjusted {adjusted:.2g}; false alarms {settings.false_alarm_rate:.1%} a run)"
    )
    if reason == "awaiting confirmation":
        text = f"awaiting confirmation: {text}"
    elif reason == "underpowered":
        text = f"{_underpowered_text(context['mde_confirmed'], more_runs, more_trials, noise, settings)}; {text}"
    elif verdict in ALARMS:
        text = f"{verdict} started {run - start} run(s) back: {text}" if start != run else f"{verdict}: {text}"
    return StepResult(
        run=run,
        verdict=verdict,
        reason=reason,
        change_start=start,
        new_runs=int(test["k"]),
        reference_runs=int(test["used"]),
        relative_change=relative,
        ci_low=low,
        ci_high=high,
        interval_level=1 - level,
        p_value=float(test["p"]),
        adjusted_p=adjusted,
        false_alarm_rate=settings.false_alarm_rate,
        noise=noise,
        mde_first=context["mde_first"],
        mde_confirmed=context["mde_confirmed"],
        runs_needed=more_runs,
        trials_needed=more_trials,
        detail=text,
    )


def _underpowered_text(
    mde: float, more_runs: int | None, more_trials: int | None, noise: Noise, settings: DetectionSettings
) -> str:
    if more_runs is not None:
        how = f"{more_runs} more run(s)"
    elif more_trials is not None:
        how = (
            f"{more_trials} trials per run: a full window of {settings.window} runs at "
            f"{noise.trials_per_run:g} is not enough"
        )
    else:
        how = (
            f"fewer noisy weeks: the between-run noise ({_cv(noise.between_sd, settings.scale):.1%}) alone exceeds "
            f"what {settings.window} runs resolve, and more trials per run do not help"
        )
    return (
        f"this cell cannot detect a {settings.target_change:.0%} change yet (smallest detectable within "
        f"{settings.confirmation + 1} runs: {mde:.1%}; needs {how})"
    )


# ---------------------------------------------------------------------------------------------------
# The accepted baseline as a reference run


def reference_test(
    series: RunSeries,
    reference: Sequence[float],
    noise: Noise | None,
    direction: Direction,
    settings: DetectionSettings = DetectionSettings(),
) -> StepResult:
    """The newest run of ``series`` against a reference run (the accepted baseline's trial values),
    both centred as the series' runs are, with the run-to-run ``noise`` of the cell's history (that of
    the per-run test's reference window at the newest run, or of the last window that had one: a
    change of level leaves the noise as it was): t = difference / (run sd x sqrt 2), two-sided at
    ``false_alarm_rate``. Without a run sd yet: "cannot tell yet", insufficient history."""
    settings = dataclasses.replace(settings, scale=series.scale)
    run = len(series.values) - 1
    if noise is None or math.isnan(noise.run_sd) or noise.run_df < 1:
        detail = (
            f"insufficient history: the baseline is judged against the run-to-run noise of the cell's history, "
            f"which needs {settings.min_reference_runs + 1} runs"
        )
        return _undecided(run, "cannot tell yet", "insufficient history", detail, settings)
    runs = _Runs.of(series, 0, run + 1, settings.huber_k)
    if not len(runs.value) or runs.position[-1] != run:
        return _undecided(run, "not measured", None, "no value of the cell in this run", settings)
    baseline = reference_centre(series, reference, settings)
    if math.isnan(baseline):
        return _undecided(run, "cannot tell yet", "insufficient history", "the baseline has no value of it", settings)
    diff = float(runs.value[-1]) - baseline
    df = noise.run_df
    se = noise.run_sd * math.sqrt(2)
    p = float(_p_two_sided(diff / se, df)) if se > 0 else (1.0 if diff == 0 else 0.0)
    half = _t_quantile(df, settings.false_alarm_rate / 2) * se
    relative, low, high = (_relative(value, baseline, settings.scale) for value in (diff, diff - half, diff + half))
    mde = math.nan
    if not math.isnan(noise.run_sd):
        shift = _noncentrality(df, _t_quantile(df, settings.false_alarm_rate / 2), settings.power) * se
        mde = math.expm1(shift) if settings.scale == "log" else shift
    if p <= settings.false_alarm_rate:
        verdict, reason = _verdict_of(diff, direction), None
    elif mde <= settings.target_change:
        verdict, reason = "unchanged", None
    else:
        verdict, reason = "cannot tell yet", "underpowered"
    change = (
        f"{relative:+.1%} [{low:+.1%}, {high:+.1%}]"
        if settings.scale == "log"
        else f"{relative:+.3g} [{low:+.3g}, {high:+.3g}]"
    )
    detail = (
        f"this run vs the baseline: {change}, p = {p:.2g} (false alarms {settings.false_alarm_rate:.1%}; "
        f"run-to-run sd from {df + 1} run(s); smallest detectable change {mde:.1%})"
    )
    return dataclasses.replace(
        _undecided(run, verdict, reason, detail, settings),
        new_runs=1,
        reference_runs=1,
        relative_change=relative,
        ci_low=low,
        ci_high=high,
        interval_level=1 - settings.false_alarm_rate,
        p_value=p,
        adjusted_p=p,
        noise=noise,
        mde_first=mde,
        mde_confirmed=mde,
    )


def reference_centre(series: RunSeries, reference: Sequence[float], settings: DetectionSettings) -> float:
    """The reference run's value on the analysis scale, centred as the runs of ``series`` are (with
    their pooled within-run sd); NaN without a value."""
    values = run_series([reference], series.scale).values
    scale = _Runs.of(series, 0, len(series.values), settings.huber_k).scale
    return float(huber_centres(values, scale, settings.huber_k)[0])


# ---------------------------------------------------------------------------------------------------
# Whole-history change points (apache-otava)


def _change_points(values: np.ndarray, settings: DetectionSettings) -> dict[int, float]:
    """otava's change points of ``values`` (index where the new level starts: p-value), those that would
    leave a segment shorter than ``history_min_segment`` dropped."""
    if len(values) < 3:
        return {}
    points, _ = compute_change_points(
        values.tolist(), window_len=settings.history_window, max_pvalue=settings.history_max_pvalue, min_magnitude=0.0
    )
    p_values = {int(point.index): float(point.stats.pvalue) for point in points}
    kept = _long_segments(sorted(p_values), len(values), settings.history_min_segment)
    return {index: p_values[index] for index in kept}


def _long_segments(indices: list[int], size: int, shortest: int) -> list[int]:
    """The change points left once every segment has ``shortest`` runs: a short first or last
    segment loses its one change point, a short segment inside loses both."""
    while True:
        bounds = [0, *indices, size]
        short = next(
            (number for number in range(len(bounds) - 1) if bounds[number + 1] - bounds[number] < shortest), None
        )
        if short is None or not indices:
            return indices
        removed = {bounds[short], bounds[short + 1]}
        indices = [index for index in indices if index not in removed]


def change_points(series: RunSeries, settings: DetectionSettings = DetectionSettings()) -> dict[int, float]:
    """The whole-history change points as the analysis of the series' last run names them: the position
    of the run in which each change started -> apache-otava's p-value."""
    runs = _Runs.of(series, 0, len(series.values), settings.huber_k)
    return {int(runs.position[index]): p for index, p in _change_points(runs.value, settings).items()}


def history_changes(
    series: RunSeries, direction: Direction, settings: DetectionSettings = DetectionSettings()
) -> list[HistoryChange]:
    """apache-otava's change points of the measured runs' values (missing runs left out, not
    forward-filled as otava's own series analysis does), as the analysis of the series' last run names
    them; each with ``first_found``: the first run whose analysis (of the runs up to it) named it."""
    settings = dataclasses.replace(settings, scale=series.scale)
    runs = _Runs.of(series, 0, len(series.values), settings.huber_k)
    found = _change_points(runs.value, settings)
    bounds = [0, *found, len(runs.value)]
    levels = [float(np.mean(runs.value[start:stop])) for start, stop in itertools.pairwise(bounds)]
    changes = []
    for number, (index, p_value) in enumerate(found.items()):
        before, after = levels[number], levels[number + 1]
        first_found = _first_found(series, runs, index, settings)
        changes.append(
            HistoryChange(
                run=int(runs.position[index]),
                before=to_original(before, settings.scale),
                after=to_original(after, settings.scale),
                relative_change=_relative(after - before, before, settings.scale),
                p_value=p_value,
                verdict=_verdict_of(after - before, direction),
                first_found=first_found,
            )
        )
    return changes


def _first_found(series: RunSeries, runs: _Runs, index: int, settings: DetectionSettings) -> int:
    """The first measured run whose analysis names a change starting at measured index ``index``."""
    for stop in range(index + settings.history_min_segment, len(runs.value)):
        analysed = int(runs.position[stop - 1])
        if int(runs.position[index]) in change_points(RunSeries(series.values[: analysed + 1], series.scale), settings):
            return analysed
    return int(runs.position[-1])


# ---------------------------------------------------------------------------------------------------
# Epochs to target: one-sided, in the manner of rcp_checker


@functools.lru_cache(maxsize=256)
def olympic_variance_factor(n: int) -> float:
    """Var(olympic mean of n normal values) / sigma**2: for 3 values the median's (0.449), about
    1 / (n - 2) for large n. Fixed-seed simulation."""
    if n <= 2:
        return 1.0 / max(n, 1)
    draws = np.sort(np.random.default_rng(1000 + n).standard_normal((40_000, n)), axis=1)
    return float(np.var(draws[:, 1:-1].mean(axis=1)))


def _olympic_mean(values: np.ndarray) -> float:
    """rcp_checker's olympic mean: the lowest and the highest value left out (from 3 values on)."""
    values = np.sort(values)
    return float(np.mean(values[1:-1] if len(values) >= 3 else values))


def _fisher_greater(table: list[list[int]]) -> float:
    """One-sided (greater) p of Fisher's exact test of a 2 x 2 table [[a, b], [c, d]]: the chance of at
    least ``a`` in the first cell given the margins (hypergeometric tail, exact integers; as
    scipy.stats.fisher_exact(alternative="greater"), without its per-call cost)."""
    (a, b), (c, d) = table
    row, column, total = a + b, a + c, a + b + c + d
    tail = sum(math.comb(column, x) * math.comb(total - column, row - x) for x in range(a, min(row, column) + 1))
    return tail / math.comb(total, row)


def convergence_test(
    history: Sequence[Sequence[float] | None],
    new: Sequence[float],
    settings: DetectionSettings = DetectionSettings(),
    resolution: float = 0.0,
) -> ConvergenceResult:
    """One-sided test: does the new run converge slower than the cell's history (the last ``window``
    runs with trials)? NaN: the trial did not reach the target. Two parts, each at half the
    ``false_alarm_rate`` when the new run has a missed trial (Bonferroni), the epochs part at the whole
    rate when it has none:

    - more trials missed the target than before: Fisher's exact test, one-sided, of this run's missed
      and reached trials against the history's;
    - more epochs to target, as rcp_checker judges them: olympic means (a run's lowest and highest
      trial left out), a one-sided t test that assumes the new run has the reference's spread, and a
      threshold: rcp's "min epochs" mirrored, the largest acceptable mean (``max_slowdown`` = threshold
      / reference mean), in closed form (rcp bisects the same equation). Unlike rcp_checker, whose
      reference runs are independent trainings, the run is the unit: the mean of the reference runs'
      olympic means and the spread of those as the error term (trial and week-level noise together;
      exact t with runs - 1 df), widened for a new run with fewer trials than usual; on the log scale
      (epochs vary multiplicatively and are skewed). ``resolution`` (the evaluation interval, in epochs)
      floors the spread at the rounding to the evaluation grid, so a deterministic history (same seeds
      every week) still has a threshold."""
    recorded = [np.asarray([] if values is None else values, dtype=float) for values in history]
    recorded = [values for values in recorded if len(values)][-settings.window :]
    missed_before = int(sum(np.isnan(values).sum() for values in recorded))
    trials_before = int(sum(len(values) for values in recorded))
    runs = [values[~np.isnan(values)] for values in recorded]
    runs = [values for values in runs if len(values)]
    new_values = np.asarray(new, dtype=float)
    missed = int(np.isnan(new_values).sum())
    new_values = new_values[~np.isnan(new_values)]
    nan = math.nan
    empty = {"reference_mean": nan, "new_mean": nan, "max_acceptable": nan, "max_slowdown": nan}
    empty |= {"relative_change": nan, "p_value": nan, "false_alarm_rate": settings.false_alarm_rate}
    if len(new_values) == 0 and not runs:
        return ConvergenceResult("no value", 0, new_trials=0, detail="no trial reached the target", **empty)
    # Bonferroni over the two parts; without a missed trial the miss test cannot alarm, and the epochs
    # test has the whole rate.
    part = settings.false_alarm_rate / 2 if missed else settings.false_alarm_rate
    misses = ""
    if runs and missed:
        table = [[missed, len(new_values)], [missed_before, trials_before - missed_before]]
        miss_p = _fisher_greater(table)
        misses = (
            f"{missed} of {missed + len(new_values)} trial(s) missed the target, {missed_before} of "
            f"{trials_before} before (one-sided Fisher p = {miss_p:.2g})"
        )
        if miss_p <= part:
            return ConvergenceResult("regression", len(runs), new_trials=len(new_values), detail=misses, **empty)
    if len(runs) < settings.min_reference_runs or len(new_values) == 0:
        detail = (
            f"insufficient history: {len(runs)} earlier run(s) reached the target; the epochs test needs "
            f"{settings.min_reference_runs} and a trial of this run that reached it"
        )
        return ConvergenceResult(
            "cannot tell yet",
            len(runs),
            new_trials=len(new_values),
            detail="; ".join(filter(None, [detail, misses])),
            **empty,
        )
    log = settings.scale == "log"
    scaled = [np.log(values) if log else values for values in runs]
    new_scaled = np.log(new_values) if log else new_values
    run_means = np.array([_olympic_mean(values) for values in scaled])
    level, new_level = float(run_means.mean()), _olympic_mean(new_scaled)
    groups = [values for values in scaled if len(values) >= 2]
    dof = sum(len(values) - 1 for values in groups)
    within = (
        math.sqrt(sum(float(np.var(values, ddof=1)) * (len(values) - 1) for values in groups) / dof) if dof else 0.0
    )
    typical = int(np.median([len(values) for values in runs]))
    # Rounding to the evaluation grid as the least within-run spread (deterministic runs, same seeds).
    grid = resolution / math.exp(level) if log else resolution
    run_variance = max(float(np.var(run_means, ddof=1)), olympic_variance_factor(typical) * grid**2 / 12)
    extra = max(0.0, olympic_variance_factor(len(new_values)) - olympic_variance_factor(typical)) * within**2
    se = math.sqrt(run_variance * (1 + 1 / len(runs)) + extra)
    df = len(runs) - 1
    bound = level + _t_quantile(df, part) * se
    p_value = float(scipy.special.stdtr(df, -(new_level - level) / se)) if se > 0 else float(new_level <= level)
    back = math.exp if log else float
    reference_mean, new_mean, threshold = back(level), back(new_level), back(bound)
    verdict = "regression" if new_mean > threshold else "unchanged"
    detail = (
        f"mean epochs {new_mean:.4g} vs {reference_mean:.4g} over {len(runs)} run(s) "
        f"({new_mean / reference_mean - 1:+.1%}); acceptable up to {threshold:.4g} "
        f"(x{threshold / reference_mean:.3f}), one-sided p = {p_value:.2g}"
    )
    if misses:
        detail += f"; {misses}"
    return ConvergenceResult(
        verdict=verdict,
        reference_runs=len(runs),
        reference_mean=reference_mean,
        new_mean=new_mean,
        new_trials=len(new_values),
        max_acceptable=threshold,
        max_slowdown=threshold / reference_mean,
        relative_change=new_mean / reference_mean - 1,
        p_value=p_value,
        false_alarm_rate=settings.false_alarm_rate,
        detail=detail,
    )
