"""Epochs to target (``convergence_test``): one-sided against the cell's history, in the manner of
MLPerf's reference convergence points (after mlperf-logging's rcp_checker), with the run as the unit."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import numpy as np
import scipy.special

from mlcampaign.analysis.detection.settings import DEFAULT_SETTINGS, DetectionSettings
from mlcampaign.analysis.detection.statistic import t_quantile


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
    settings: DetectionSettings = DEFAULT_SETTINGS,
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
    return _epochs_test(runs, new_values, part, misses, settings, resolution)


def _epochs_test(
    runs: list[np.ndarray],
    new_values: np.ndarray,
    part: float,
    misses: str,
    settings: DetectionSettings,
    resolution: float,
) -> ConvergenceResult:
    """The epochs part of ``convergence_test`` at level ``part``: the new run's trials that reached the
    target (``new_values``) against the reference ``runs``' (``misses``: what the miss test found, or '')."""
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
    bound = level + t_quantile(df, part) * se
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
