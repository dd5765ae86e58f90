"""The accepted baseline as a reference run (``reference_test``): the newest run against it, with the
run-to-run noise of the cell's history as the error term, as the per-run test judges runs."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from mlcampaign.analysis.detection.power import noncentrality
from mlcampaign.analysis.detection.run_values import (
    MeasuredRuns,
    Noise,
    RunSeries,
    as_relative,
    huber_centres,
    run_series,
)
from mlcampaign.analysis.detection.settings import DEFAULT_SETTINGS, DetectionSettings, Direction, verdict_of
from mlcampaign.analysis.detection.statistic import p_two_sided, t_quantile
from mlcampaign.analysis.detection.steps import StepResult, change_text, undecided


def reference_test(
    series: RunSeries,
    reference: Sequence[float],
    noise: Noise | None,
    direction: Direction,
    settings: DetectionSettings = DEFAULT_SETTINGS,
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
        return undecided(run, "cannot tell yet", "insufficient history", detail, settings)
    runs = MeasuredRuns.of(series, 0, run + 1, settings.huber_k)
    if not len(runs.value) or runs.position[-1] != run:
        return undecided(run, "not measured", None, "no value of the cell in this run", settings)
    baseline = reference_centre(series, reference, settings)
    if math.isnan(baseline):
        return undecided(run, "cannot tell yet", "insufficient history", "the baseline has no value of it", settings)
    diff = float(runs.value[-1]) - baseline
    df = noise.run_df
    se = noise.run_sd * math.sqrt(2)
    p = float(p_two_sided(diff / se, df)) if se > 0 else (1.0 if diff == 0 else 0.0)
    half = t_quantile(df, settings.false_alarm_rate / 2) * se
    relative, low, high = (as_relative(value, baseline, settings.scale) for value in (diff, diff - half, diff + half))
    mde = math.nan
    if not math.isnan(noise.run_sd):
        shift = noncentrality(df, t_quantile(df, settings.false_alarm_rate / 2), settings.power) * se
        mde = math.expm1(shift) if settings.scale == "log" else shift
    if p <= settings.false_alarm_rate:
        verdict, reason = verdict_of(diff, direction), None
    elif mde <= settings.target_change:
        verdict, reason = "unchanged", None
    else:
        verdict, reason = "cannot tell yet", "underpowered"
    detail = (
        f"this run vs the baseline: {change_text(relative, low, high, settings)}, p = {p:.2g} "
        f"(false alarms {settings.false_alarm_rate:.1%}; "
        f"run-to-run sd from {df + 1} run(s); smallest detectable change {mde:.1%})"
    )
    return dataclasses.replace(
        undecided(run, verdict, reason, detail, settings),
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
    scale = MeasuredRuns.of(series, 0, len(series.values), settings.huber_k).scale
    return float(huber_centres(values, scale, settings.huber_k)[0])
