"""Whole-history change points (``history_changes``): apache-otava's E-Divisive with a t test (split and
merge, Fleming et al., ICPE 2023) on the measured runs' values, re-run at every run, so that a change
missed when it happened is found later and named by the run in which it started."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
from otava.analysis import compute_change_points

from mlcampaign.analysis.detection.run_values import (
    MeasuredRuns,
    RunSeries,
    as_relative,
    huber_centres,
    to_original,
    within_sds,
)
from mlcampaign.analysis.detection.settings import DEFAULT_SETTINGS, DetectionSettings, Direction, verdict_of
from mlcampaign.analysis.detection.statistic import p_two_sided, t_quantile


@dataclasses.dataclass(frozen=True)
class HistoryChange:
    """A change point of the whole history, as the first analysis that named it saw it: the run in which
    it started, the levels either side, and its size with an interval at apache-otava's level (its own t
    test of the two segments: the interval excludes 0 exactly when otava's p is below its threshold)."""

    run: int  # position in the series of the run in which the change started
    before: float  # level before (original units; geometric mean of run values on the log scale)
    after: float
    relative_change: float
    ci_low: float
    ci_high: float
    interval_level: float
    p_value: float  # apache-otava's
    verdict: str  # regression / improvement
    first_found: int  # position of the first run whose analysis named it
    hidden: bool = False  # the per-run test had listed the same change (scan): not listed again


def _change_points(values: np.ndarray, settings: DetectionSettings) -> dict[int, tuple]:
    """otava's change points of ``values`` (index where the new level starts: its t test's statistics
    (mean before, mean after, sd before, sd after, p, runs before, runs after)), those that would leave a
    segment shorter than ``history_min_segment`` dropped."""
    if len(values) < 3 or not _may_split(values[None, :], settings)[0]:
        return {}
    points, _ = compute_change_points(
        values.tolist(), window_len=settings.history_window, max_pvalue=settings.history_max_pvalue, min_magnitude=0.0
    )
    indices = [int(point.index) for point in points]
    bounds = [0, *indices, len(values)]
    statistics = {
        index: (
            point.stats.mean_1,
            point.stats.mean_2,
            point.stats.std_1,
            point.stats.std_2,
            point.stats.pvalue,
            index - bounds[number],
            bounds[number + 2] - index,
        )
        for number, (index, point) in enumerate(zip(indices, points, strict=True))
    }
    kept = _long_segments(sorted(statistics), len(values), settings.history_min_segment)
    return {index: statistics[index] for index in kept}


def _may_split(rows: np.ndarray, settings: DetectionSettings) -> np.ndarray:
    """Per row of values (NaN-padded on the left): whether otava's split step can find a change point
    there. Only where one of its sliding windows (window_len, step window_len / 2) has a split whose t
    test (as otava computes it: the segments' population sds in scipy's pooled ttest_ind_from_stats) has
    p at most its first-pass threshold; where none does, otava finds none and is not called (it costs
    ~1 ms a call; most runs' analyses of an unchanged history end here)."""
    window = settings.history_window
    first_pass = settings.history_max_pvalue * (10 if settings.history_max_pvalue < 0.05 else 2)
    count = (~np.isnan(rows)).sum(axis=1)
    columns = (rows.shape[1] - count)[:, None] + np.arange(rows.shape[1])[None, :]
    aligned = np.take_along_axis(rows, np.minimum(columns, rows.shape[1] - 1), axis=1)
    aligned[columns >= rows.shape[1]] = np.nan  # each row's values from column 0 on
    found = np.zeros(len(rows), dtype=bool)
    for start in range(0, rows.shape[1], window // 2):
        part = aligned[:, start : start + window]
        present = ~np.isnan(part)
        size = present.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # windows past a row's values: not used
            part = np.where(present, part - np.nanmean(part, axis=1, keepdims=True), 0.0)
            left = np.arange(1, part.shape[1])[None, :]
            right = size[:, None] - left
            sums, squares = np.cumsum(part, axis=1)[:, :-1], np.cumsum(part**2, axis=1)[:, :-1]
            left_mean, right_mean = sums / left, (part.sum(axis=1)[:, None] - sums) / right
            left_var = np.maximum(squares / left - left_mean**2, 0.0)
            right_var = np.maximum(((part**2).sum(axis=1)[:, None] - squares) / right - right_mean**2, 0.0)
            df = (size - 2)[:, None]
            pooled = ((left - 1) * left_var + (right - 1) * right_var) / df
            t = (left_mean - right_mean) / np.sqrt(pooled * (1 / left + 1 / right))
            p = p_two_sided(t, df)
        valid = (right >= 1) & (df >= 1)
        found |= np.any(valid & ~(p > first_pass * (1 + 1e-6)), axis=1)
    return found


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


def change_points(series: RunSeries, settings: DetectionSettings = DEFAULT_SETTINGS) -> dict[int, float]:
    """The whole-history change points as the analysis of the series' last run names them (every run):
    the position of the run in which each change started -> apache-otava's p-value."""
    runs = MeasuredRuns.of(series, 0, len(series.values), settings.huber_k)
    return {int(runs.position[index]): found[4] for index, found in _change_points(runs.value, settings).items()}


def _prefix_values(series: RunSeries, settings: DetectionSettings) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For the analysis of every measured run (rows): the values of the measured runs it looks at (up to
    ``history_lookback`` runs up to it, each centred with their pooled within-run sd, as MeasuredRuns
    does), NaN-padded on the left; the measured runs' positions; the first measured run each row holds."""
    measured = np.flatnonzero(series.n > 0)
    values = series.values[measured]
    lookback = settings.history_lookback
    last = np.arange(len(measured))
    first = np.maximum(0, last - lookback + 1)
    index = last[:, None] - (lookback - 1) + np.arange(lookback)[None, :]
    inside = index >= first[:, None]
    trials = np.where(inside[..., None], values[np.maximum(index, 0)], np.nan)
    n = (~np.isnan(trials)).sum(axis=2)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.nansum(trials, axis=2) / n
        variance = np.where(n >= 2, np.nansum((trials - mean[..., None]) ** 2, axis=2) / (n - 1), np.nan)
    scale, _ = within_sds(n, variance)
    centres = huber_centres(trials.reshape(-1, trials.shape[2]), np.repeat(scale, lookback), settings.huber_k)
    return np.where(inside, centres.reshape(len(last), lookback), np.nan), measured, first


def history_changes(
    series: RunSeries, direction: Direction, settings: DetectionSettings = DEFAULT_SETTINGS
) -> list[HistoryChange]:
    """Every change point that the analysis of some run names (apache-otava on the values of the measured
    runs up to it, missing runs left out, not forward-filled as otava's own series analysis does; the
    last ``history_lookback`` runs), in the order found: each as the first analysis that named it saw it
    (``first_found``). A change point named again later, at its start or one run from it in the same
    direction (otava's split may move by a run as runs arrive), is the same change."""
    settings = dataclasses.replace(settings, scale=series.scale)
    rows, measured, first = _prefix_values(series, settings)
    may_split = _may_split(rows, settings)
    found: list[HistoryChange] = []
    for number in range(2 * settings.history_min_segment - 1, len(measured)):
        if not may_split[number]:
            continue
        values = rows[number][~np.isnan(rows[number])]
        for index, statistics in _change_points(values, settings).items():
            start = int(first[number]) + index
            change = _history_change(statistics, int(measured[start]), int(measured[number]), direction, settings)
            same = [
                earlier
                for earlier in found
                if earlier.verdict == change.verdict and abs(int(np.searchsorted(measured, earlier.run)) - start) <= 1
            ]
            if not same:
                found.append(change)
    return found


def _history_change(
    statistics: tuple, run: int, analysed: int, direction: Direction, settings: DetectionSettings
) -> HistoryChange:
    """A HistoryChange from otava's t test of a change point: its interval from the same statistics
    (the pooled two-sample t test of scipy's ttest_ind_from_stats, as otava calls it)."""
    mean_before, mean_after, sd_before, sd_after, p_value, runs_before, runs_after = statistics
    df = runs_before + runs_after - 2
    pooled = ((runs_before - 1) * sd_before**2 + (runs_after - 1) * sd_after**2) / df
    half = t_quantile(df, settings.history_max_pvalue / 2) * np.sqrt(pooled * (1 / runs_before + 1 / runs_after))
    diff = mean_after - mean_before
    relative, low, high = (
        as_relative(value, mean_before, settings.scale) for value in (diff, diff - half, diff + half)
    )
    return HistoryChange(
        run=run,
        before=to_original(mean_before, settings.scale),
        after=to_original(mean_after, settings.scale),
        relative_change=relative,
        ci_low=low,
        ci_high=high,
        interval_level=1 - settings.history_max_pvalue,
        p_value=float(p_value),
        verdict=verdict_of(diff, direction),
        first_found=analysed,
    )
