"""Relative judging: a cell's trials taken relative to the machine as it was during each trial (the trial's metric
over its own canary, on the log scale), where that measurably lowers the cell's run-to-run noise.

Week-level noise that the machine's canaries see (a slower node, a busier file system, a co-runner) moves a
run's trials and their canaries together; the trial's metric less its canary (log scale, the canary's sign
following the metric's better direction: throughput over matmul FLOP/s, time per sample times it) takes it out.
Whether it does, for a cell, is decided on the cell's own reference only (``choose``): its runs before the
newest ``confirmation + 1`` (the runs a change is tested on never choose how they are judged), at least
MIN_REFERENCE_RUNS of them, each with the canary in every trial with a value. The run values' variance, raw
against relative, compared by the F test for paired samples (Pitman-Morgan: the two series are of the same runs,
so their variances differ exactly when their sum and difference correlate; a t test of that correlation with
runs - 2 degrees of freedom, far more powerful than the F ratio of independent samples here), one-sided at
RELATIVE_LEVEL; among the canaries that pass, the one that lowers it most. A canary adds its own noise to every
trial: where it does not share the cell's, relative values are noisier and the test keeps the raw ones.

Contended trials (their timing disturbed: mlcampaign.measure.contention) are judged too where the cell is judged
relative and the contention was the same while the canary and the training ran: the matmul roof measured before
and after the training within STEADY_CONTENTION of each other (``steady_contention``); others are left out as
before (regression.keep_contended).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import scipy.special

from mlcampaign.analysis import detection

# One-sided level of the paired F test (raw over relative run-to-run variance) that chooses relative judging.
RELATIVE_LEVEL = 0.05
# Fewest reference runs the choice is made on.
MIN_REFERENCE_RUNS = 4
# A contended trial's matmul roof before and after the training agree within this (relative): the contention
# its canaries saw is the contention its training saw.
STEADY_CONTENTION = 0.03


@dataclasses.dataclass(frozen=True)
class RelativeChoice:
    """How a cell is judged: relative to ``canary`` (None: raw), with the run-to-run coefficients of variation of
    its reference runs, raw and relative to the chosen (or best) canary, and the paired F test's p."""

    canary: str | None
    raw_cv: float
    relative_cv: float
    p_value: float
    reference_runs: int

    @property
    def detail(self) -> str:
        if self.canary is None:
            return ""
        return (
            f"judged relative to {self.canary}: run-to-run CV {self.raw_cv:.1%} -> {self.relative_cv:.1%} "
            f"(paired F test on {self.reference_runs} reference runs, p = {self.p_value:.2g})"
        )


RAW = RelativeChoice(None, math.nan, math.nan, math.nan, 0)


def relative_trials(values: Sequence[np.ndarray], canary: Sequence[np.ndarray], sign: float) -> list[np.ndarray]:
    """Each run's trial values relative to their own canary: value x canary^-sign (log: log value - sign x log
    canary); NaN where a trial has no canary."""
    return [np.asarray(v, float) * np.asarray(c, float) ** -sign for v, c in zip(values, canary, strict=True)]


def _run_values(trials: Sequence[np.ndarray], settings: detection.DetectionSettings) -> np.ndarray:
    clean = [values[np.isfinite(values) & (values > 0)] for values in trials]
    return detection.run_values(detection.run_series(clean, "log"), settings)


def choose(
    values: Sequence[np.ndarray],
    canaries: Mapping[str, tuple[Sequence[np.ndarray], float]],
    settings: detection.DetectionSettings,
) -> RelativeChoice:
    """The RelativeChoice of a cell (module docstring): ``values`` its runs' trial values (positive), ``canaries``
    name -> (its runs' trial canary values aligned with them, NaN where absent; the sign of the canary in the
    relative value)."""
    measured = [position for position, run in enumerate(values) if np.isfinite(run).any()]
    reference = measured[: max(0, len(measured) - settings.confirmation - 1)]
    if len(reference) < MIN_REFERENCE_RUNS:
        return RAW
    raw = _run_values([values[position] for position in reference], settings)
    raw_var = float(np.var(raw, ddof=1))
    best = RAW
    for name, (canary, sign) in canaries.items():
        if not all(
            np.isfinite(canary[p][np.isfinite(values[p])]).all() and np.isfinite(canary[p]).any() for p in measured
        ):
            continue  # a run without the canary in a trial with a value: no relative series
        relative = relative_trials([values[p] for p in reference], [canary[p] for p in reference], sign)
        relative_values = _run_values(relative, settings)
        relative_var = float(np.var(relative_values, ddof=1))
        if not relative_var > 0:
            continue
        p_value = paired_variance_p(raw, relative_values)
        choice = RelativeChoice(
            name, math.expm1(math.sqrt(raw_var)), math.expm1(math.sqrt(relative_var)), p_value, len(reference)
        )
        if p_value <= RELATIVE_LEVEL and (best.canary is None or choice.relative_cv < best.relative_cv):
            best = choice
    return best


def paired_variance_p(first: np.ndarray, second: np.ndarray) -> float:
    """One-sided p that ``first`` varies more than ``second`` (values of the same runs): Pitman-Morgan's test, the
    correlation of their sums and differences, t distributed with n - 2 degrees of freedom."""
    total, difference = first + second, first - second
    correlation = float(np.corrcoef(total, difference)[0, 1])
    if not math.isfinite(correlation):
        return math.nan
    dof = len(first) - 2
    t = correlation * math.sqrt(dof / max(1e-300, 1 - correlation**2))
    return float(scipy.special.stdtr(dof, -t))


def steady_contention(trials: pd.DataFrame) -> pd.Series:
    """Which contended trials' matmul roof before and after the timed training agree within STEADY_CONTENTION
    (the contention the canaries saw is the training's)."""
    before = trials.get("matmul_before_flops_per_s")
    after = trials.get("matmul_after_flops_per_s")
    if before is None or after is None:
        return pd.Series(False, index=trials.index)
    with np.errstate(all="ignore"):
        drift = np.abs(np.log(after.to_numpy(float) / before.to_numpy(float)))
    return pd.Series(drift <= math.log1p(STEADY_CONTENTION), index=trials.index)
