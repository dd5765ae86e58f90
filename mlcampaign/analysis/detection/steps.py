"""The verdict of the per-run test at one run (``StepResult``) and its text: what it found, against what,
at which level, and what the cell would need to detect the target change."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from mlcampaign.analysis.detection.power import null_of, runs_needed, trials_needed
from mlcampaign.analysis.detection.run_values import Noise, as_cv, as_relative
from mlcampaign.analysis.detection.settings import ALARMS, DetectionSettings
from mlcampaign.analysis.detection.statistic import t_quantile


@dataclasses.dataclass(frozen=True)
class StepResult:
    """The per-run test at one run (``scan``)."""

    run: int  # position of the run in the series
    verdict: str
    reason: str | None
    change_start: int | None  # position of the run in which the change started (listed changes)
    new_runs: int  # runs in the tested new segment
    reference_runs: int
    relative_change: float  # new / reference - 1 (log scale); (new - reference) / |reference| (linear)
    ci_low: float
    ci_high: float
    interval_level: float  # 1 - per-test level: the interval excludes 0 exactly when the test alarms
    p_value: float  # of the reported test
    adjusted_p: float  # over all candidate starts of this run: compare with the per-run test's rate
    false_alarm_rate: float
    noise: Noise | None
    mde_first: float  # smallest change detected at the first changed run with the configured power
    mde_confirmed: float  # ... within the confirmation window
    runs_needed: int | None  # more runs before target_change is detectable (None: a full window is not enough)
    trials_needed: int | None  # trials per run for target_change at a full window (None: no number suffices)
    detail: str
    source: str | None = None  # the detector that listed the change of this verdict ("per run", "big drop")
    updates: int | None = None  # the run (position) whose listing of the same change this one updates


def undecided(
    run: int, verdict: str, reason: str | None, detail: str, settings: DetectionSettings, runs_needed: int | None = None
) -> StepResult:
    """A StepResult without a test."""
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


def interval(test: dict, level: float, settings: DetectionSettings) -> tuple[float, float, float]:
    """The change of a candidate test (``diff``, ``se``, ``df`` and the reference ``level``) and its
    interval at the per-test ``level``, as relative changes."""
    half = t_quantile(float(test["df"]), level / 2) * float(test["se"])
    diff = float(test["diff"])
    values = (diff, diff - half, diff + half)
    return tuple(as_relative(value, float(test["level"]), settings.scale) for value in values)


def change_text(relative: float, low: float, high: float, settings: DetectionSettings) -> str:
    if settings.scale == "log":
        return f"{relative:+.1%} [{low:+.1%}, {high:+.1%}]"
    return f"{relative:+.3g} [{low:+.3g}, {high:+.3g}]"


def step_result(test: dict, verdict: str, reason: str | None, settings: DetectionSettings, context: dict) -> StepResult:
    """The StepResult of the candidate ``test`` (a Candidates row with its ``start`` position) at the run
    ``context["run"]``, at the per-test ``context["level"]`` of the candidates' ``context["structure"]``."""
    level = context["level"]
    relative, low, high = interval(test, level, settings)
    null = null_of(context["structure"], settings)
    adjusted = float(np.searchsorted(null, test["p"], side="right") / len(null))
    start, run = int(test["start"]), context["run"]
    noise = context["noise"]
    more_runs = runs_needed(noise.run_sd, context["reference_runs"], settings)
    more_trials = trials_needed(noise, settings)
    left_out = int(test["size"]) - int(test["used"])
    against = f"{int(test['used'])} earlier run(s)" + (f" ({left_out} outlying left out)" if left_out else "")
    text = (
        f"{test['k']} run(s) from {'this one' if test.get('newest', True) else 'its start'} vs {against}: "
        f"{change_text(relative, low, high, settings)}, p = {test['p']:.2g} "
        f"(adjusted {adjusted:.2g}; false alarms {settings.false_alarm_rate:.1%} a run)"
    )
    if reason == "awaiting confirmation":
        text = f"awaiting confirmation: {text}"
    elif reason == "underpowered":
        text = f"{underpowered_text(context['mde_confirmed'], more_runs, more_trials, noise, settings)}; {text}"
    elif verdict in (*ALARMS, "minor shift", "outlying run"):
        started = f"{verdict} started {run - start} run(s) back" if start != run else verdict
        text = f"{started}{context.get('listing', '')}: {text}"
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
        source=context.get("source"),
        updates=context.get("updates"),
    )


def underpowered_text(
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
            f"fewer noisy weeks: the between-run noise ({as_cv(noise.between_sd, settings.scale):.1%}) alone exceeds "
            f"what {settings.window} runs resolve, and more trials per run do not help"
        )
    return (
        f"this cell cannot detect a {settings.target_change:.0%} change yet (smallest detectable within "
        f"{settings.confirmation + 1} runs: {mde:.1%}; needs {how})"
    )
