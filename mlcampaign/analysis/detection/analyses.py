"""The data of one analysis of the per-run test (mlcampaign.analysis.detection.scan): the run values it
sees (``Spans``: per analysis, the Huber centres of its span of runs and its reference window's noise
statistics), the tests it runs (``Row``: reference runs, new runs and the segment bounds its noise is pooled
over) and their results (``Tests``)."""

from __future__ import annotations

import dataclasses
import functools
import warnings

import numpy as np

from mlcampaign.analysis.detection.run_values import (
    RunSeries,
    centre_variance_factor,
    huber_centres,
    row_medians,
    within_sds,
)
from mlcampaign.analysis.detection.settings import DetectionSettings
from mlcampaign.analysis.detection.statistic import Candidates


class Spans:
    """Per analysis (the runs in play, by index): its span of up to window + confirmation + 1 runs up to
    it, their Huber centres with the span's pooled within-run sd as the scale, the noise statistics of
    its newest run's reference window, and its newest run's trials."""

    def __init__(self, series: RunSeries, positions: np.ndarray, settings: DetectionSettings):
        self.series, self.positions, self.settings = series, positions, settings
        self.span = settings.window + max(settings.confirmation, 1) + 1
        index = np.arange(len(positions))[:, None] + np.arange(self.span)[None, :] - (self.span - 1)
        inside = index >= 0
        trials = series.values[positions[np.maximum(index, 0)]]
        trials[~inside] = np.nan
        n = (~np.isnan(trials)).sum(axis=2)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.nansum(trials, axis=2) / n
            variance = np.where(n >= 2, np.nansum((trials - mean[..., None]) ** 2, axis=2) / (n - 1), np.nan)
        self.scale, _ = within_sds(n, variance)
        centres = huber_centres(trials.reshape(-1, trials.shape[2]), np.repeat(self.scale, self.span), settings.huber_k)
        self.values = np.where(inside, centres.reshape(len(positions), self.span), np.nan)
        columns = np.arange(self.span) - (self.span - 1)
        before = inside & (columns[None, :] < 0) & (columns[None, :] >= -settings.window)
        self.within, self.within_dof = within_sds(np.where(before, n, 0), np.where(before, variance, np.nan))
        table = np.array(
            [np.nan, *(centre_variance_factor(count, settings.huber_k) for count in range(1, n.max(initial=0) + 1))]
        )
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # analyses without reference runs: NaN, not used
            self.factor = np.nanmean(np.where(before, table[np.where(before, n, 0)], np.nan), axis=1)
        self.typical = row_medians(np.where(before, n, np.nan))
        self.newest_n = n[:, -1]
        self.high = np.nanmax(np.where(inside[:, -1:, None], trials[:, -1:, :], -np.inf), axis=(1, 2))
        self.low = np.nanmin(np.where(inside[:, -1:, None], trials[:, -1:, :], np.inf), axis=(1, 2))

    def run_values(self, analysis: int, first: int) -> np.ndarray:
        """The values of runs first .. analysis as analysis ``analysis`` centres them (runs before its span
        centred on demand with its scale)."""
        oldest = analysis - self.span + 1
        own = self.values[analysis, max(first - oldest, 0) :]
        if first >= oldest:
            return own
        trials = self.series.values[self.positions[first:oldest]]
        return np.concatenate([huber_centres(trials, self.scale[analysis], self.settings.huber_k), own])


@dataclasses.dataclass(frozen=True, eq=False)
class Row:
    """One test of an analysis: reference runs (indices of the runs in play) and new runs, the segment
    bounds its noise is pooled over, and whether its level is every reference run's mean."""

    reference: tuple[int, int]
    new: tuple[int, int]
    bounds: np.ndarray
    level_of_all: bool = False

    @functools.cached_property
    def labels(self) -> np.ndarray:
        """The segment of each reference run (0: the oldest in reach)."""
        labels = np.searchsorted(self.bounds, np.arange(*self.reference), side="right")
        return labels - labels[0] if len(labels) else labels

    @functools.cached_property
    def segments(self) -> tuple[int, ...]:
        return tuple(int(runs) for runs in np.bincount(self.labels)) if len(self.labels) else ()

    @functools.cached_property
    def reference_df(self) -> int:
        return self.reference[1] - self.reference[0] - len(self.segments)


@dataclasses.dataclass(frozen=True)
class Tests:
    """The tests of one analysis: rows offset .. of candidate tests computed for several at once."""

    candidates: Candidates | None
    offset: int

    def row(self, number: int) -> dict:
        return self.candidates.row(self.offset + number)
