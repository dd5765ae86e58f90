"""Whole-history change points (``history_changes``): apache-otava's E-Divisive with a t test (split and
merge, Fleming et al., ICPE 2023) on the measured runs' values, re-run at every run, so that a change
missed when it happened is found later and named by the run in which it started."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
from otava.analysis import compute_change_points

from mlcampaign.analysis.detection.run_values import MeasuredRuns, RunSeries, as_relative, to_original
from mlcampaign.analysis.detection.settings import DEFAULT_SETTINGS, DetectionSettings, Direction, verdict_of


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


def change_points(series: RunSeries, settings: DetectionSettings = DEFAULT_SETTINGS) -> dict[int, float]:
    """The whole-history change points as the analysis of the series' last run names them: the position
    of the run in which each change started -> apache-otava's p-value."""
    runs = MeasuredRuns.of(series, 0, len(series.values), settings.huber_k)
    return {int(runs.position[index]): p for index, p in _change_points(runs.value, settings).items()}


def history_changes(
    series: RunSeries, direction: Direction, settings: DetectionSettings = DEFAULT_SETTINGS
) -> list[HistoryChange]:
    """apache-otava's change points of the measured runs' values (missing runs left out, not
    forward-filled as otava's own series analysis does), as the analysis of the series' last run names
    them; each with ``first_found``: the first run whose analysis (of the runs up to it) named it."""
    settings = dataclasses.replace(settings, scale=series.scale)
    runs = MeasuredRuns.of(series, 0, len(series.values), settings.huber_k)
    found = _change_points(runs.value, settings)
    if not found:  # no levels to compare (a series without measured runs has no mean either)
        return []
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
                relative_change=as_relative(after - before, before, settings.scale),
                p_value=p_value,
                verdict=verdict_of(after - before, direction),
                first_found=first_found,
            )
        )
    return changes


def _first_found(series: RunSeries, runs: MeasuredRuns, index: int, settings: DetectionSettings) -> int:
    """The first measured run whose analysis names a change starting at measured index ``index``."""
    for stop in range(index + settings.history_min_segment, len(runs.value)):
        analysed = int(runs.position[stop - 1])
        if int(runs.position[index]) in change_points(RunSeries(series.values[: analysed + 1], series.scale), settings):
            return analysed
    return int(runs.position[-1])
