"""The per-run test's statistic: the mean of the newest runs against the reference runs before them, on
run values, a two-sample t test whose error term is the run-to-run noise.

The reference runs fall into segments (a segment starts at each change the scan accepted: an alarm, a
whole-history change point, a minor shift under test or accepted). The reference level is the mean of
the runs of the reference's last segment (the level since the latest change); the run-to-run noise is
pooled over the segments, each run's deviation from its own segment's mean (degrees of freedom: runs -
segments), so that a run right after a change is tested at once against the runs since it, with the
noise of the whole window. One segment is the plain two-sample t test. The most outlying reference run
is left out when its studentized deleted residual is significant (Bonferroni). The calibration of the
per-test level (mlcampaign.analysis.detection.power) simulates this very function."""

from __future__ import annotations

import dataclasses
import functools
import itertools

import numpy as np
import scipy.special


def p_two_sided(t, df):
    """Two-sided p of Student's t (scipy.special: the distribution objects cost ~50 us a call)."""
    return 2 * scipy.special.stdtr(df, -np.abs(t))


@functools.lru_cache(maxsize=4096)
def t_quantile(df: float, upper_tail: float) -> float:
    """Student's t quantile with ``upper_tail`` above it."""
    return float(scipy.special.stdtrit(df, 1 - upper_tail))


@functools.lru_cache(maxsize=64)
def _outlier_criticals(largest: int, alpha: float) -> np.ndarray:
    """[runs, df]: the Bonferroni critical value of the studentized deleted residual of the most outlying
    of ``runs`` reference runs with ``df`` degrees of freedom (inf below 4 df, where none is left out)."""
    table = np.full((largest + 1, largest + 1), np.inf)
    for runs in range(5, largest + 1):
        for df in range(4, runs):
            table[runs, df] = t_quantile(df - 1, alpha / (2 * runs))
    return table


@dataclasses.dataclass(frozen=True)
class Reference:
    """Per row: the reference runs used (an outlying one left out), the runs of the level, the level,
    the pooled sum of squares and its degrees of freedom."""

    used: np.ndarray
    level_runs: np.ndarray
    level: np.ndarray
    squares: np.ndarray
    df: np.ndarray


def segmented_reference(values: np.ndarray, segments: np.ndarray, alpha: float, level_of_all=False) -> Reference:
    """The Reference of each row of ``values`` (rows x runs, NaN where a row has fewer runs), whose runs
    belong to ``segments`` (same shape or broadcastable: non-decreasing integers; the last segment
    present in a row is its level's). ``level_of_all`` (per row, or one for all): the level is the mean
    of every reference run, segments ignored (the big-drop guard's). The single most extreme run of a
    segment of 2 runs or more is left out when its studentized deleted residual (one-way layout:
    leverage 1 / segment runs) is significant at ``alpha`` (Bonferroni over the row's runs; from 4
    degrees of freedom on)."""
    present = ~np.isnan(values)
    rows = np.arange(len(values))
    filled = np.where(present, values, 0.0)
    shared = np.ndim(segments) == 1 or np.shape(segments)[0] == 1
    if shared and present.all():
        # The calibration's case (every row the same segments, all runs present): by column slices.
        labels = np.ravel(segments)
        bounds = np.flatnonzero(np.diff(labels, prepend=-1, append=labels[-1] + 1))
        own_runs = np.repeat(np.diff(bounds), np.diff(bounds))[None, :]
        segment_means = [values[:, start:stop].mean(axis=1) for start, stop in itertools.pairwise(bounds)]
        residual = values - np.repeat(np.column_stack(segment_means), np.diff(bounds), axis=1)
        used = np.full(len(values), values.shape[1])
        df = used - (len(bounds) - 1)
        last = np.full(len(values), labels[-1])
        segments = np.broadcast_to(labels, values.shape)
        level_runs = np.where(level_of_all, used, bounds[-1] - bounds[-2])
        level_sums = np.where(level_of_all, values.sum(axis=1), segment_means[-1] * (bounds[-1] - bounds[-2]))
    else:
        segments = np.broadcast_to(segments, values.shape)
        count = int(segments.max(initial=0)) + 1
        member = present[..., None] & (segments[..., None] == np.arange(count))
        segment_runs = member.sum(axis=1)
        segment_sums = np.einsum("rw,rwg->rg", filled, member)
        with np.errstate(divide="ignore", invalid="ignore"):
            segment_means = segment_sums / segment_runs
        own_runs = np.take_along_axis(segment_runs, segments, axis=1)
        residual = np.where(present, filled - np.take_along_axis(segment_means, segments, axis=1), 0.0)
        used = present.sum(axis=1)
        df = used - (segment_runs > 0).sum(axis=1)
        last = count - 1 - np.argmax((segment_runs > 0)[:, ::-1], axis=1)
        level_runs = np.where(level_of_all, used, segment_runs[rows, last])
        level_sums = np.where(level_of_all, filled.sum(axis=1), segment_sums[rows, last])
    squares = (residual**2).sum(axis=1)
    if alpha and (df >= 4).any():
        with np.errstate(divide="ignore", invalid="ignore"):
            kept = 1 - 1 / own_runs  # 1 - leverage
            others = squares[:, None] - residual**2 / kept
            deleted = np.abs(residual) / np.sqrt(others / (df - 1)[:, None] * kept)
        deleted = np.where(present & (own_runs >= 2) & np.isfinite(deleted), deleted, -np.inf)
        worst = np.argmax(deleted, axis=1)
        critical = _outlier_criticals(values.shape[1], alpha)[used, np.maximum(df, 0)]
        out = np.flatnonzero(deleted[rows, worst] > critical)
        if len(out):
            left = worst[out]
            in_level = np.broadcast_to(level_of_all, used.shape)[out] | (segments[out, left] == last[out])
            used, df, squares = used.copy(), df.copy(), squares.copy()
            used[out] -= 1
            df[out] -= 1
            squares[out] = others[out, left]
            level_runs[out] -= in_level
            level_sums[out] -= np.where(in_level, values[out, left], 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        level = level_sums / level_runs
    return Reference(used, level_runs, level, squares, df)


@dataclasses.dataclass(frozen=True)
class Candidates:
    """Per row (a candidate start): the Reference, the new runs and their mean's difference from the
    level, its standard error, degrees of freedom and two-sided p."""

    reference: Reference
    new_runs: np.ndarray
    diff: np.ndarray
    se: np.ndarray
    df: np.ndarray
    p: np.ndarray

    def row(self, number: int) -> dict:
        """One candidate as plain numbers."""
        reference = self.reference
        return {
            "used": int(reference.used[number]),
            "level": float(reference.level[number]),
            "level_runs": int(reference.level_runs[number]),
            "reference_df": int(reference.df[number]),
            "reference_squares": float(reference.squares[number]),
            "k": int(self.new_runs[number]),
            "diff": float(self.diff[number]),
            "se": float(self.se[number]),
            "df": int(self.df[number]),
            "p": float(self.p[number]),
        }


def candidate_tests(
    reference: np.ndarray, segments: np.ndarray, new: np.ndarray, alpha: float, level_of_all=False
) -> Candidates:
    """Per row: the new runs (``new``: rows x runs, NaN-padded) against the ``reference`` runs in their
    ``segments`` (segmented_reference): t = (mean of the new runs - level) / (s sqrt(1/level runs + 1/new
    runs)), s pooled over the reference's segments and the new runs (df = reference df + new runs - 1)."""
    base = segmented_reference(reference, segments, alpha, level_of_all)
    present = ~np.isnan(new)
    k = present.sum(axis=1)
    new_mean = np.where(present, new, 0.0).sum(axis=1) / k
    squares = base.squares + np.where(present, (new - new_mean[:, None]) ** 2, 0.0).sum(axis=1)
    df = base.df + k - 1
    with np.errstate(divide="ignore", invalid="ignore"):
        se = np.sqrt(squares / df * (1 / base.level_runs + 1 / k))
        diff = new_mean - base.level
        t = np.where(se > 0, diff / se, np.where(diff == 0, 0.0, np.copysign(np.inf, diff)))
    return Candidates(base, k, diff, se, df, p_two_sided(t, df))
