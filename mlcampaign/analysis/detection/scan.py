"""The per-run test (``scan``): at each run, the newest run and the runs since a candidate start up to
``confirmation`` runs back, against the up to ``window`` preceding runs of the same segment. A
two-sample t test on run values, so week-level variation shared by a run's trials is noise, not a
change, at the calibrated per-test level (mlcampaign.analysis.detection.power). Also the accepted
baseline as a reference run (``reference_test``: the same error term)."""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Sequence

import numpy as np

from mlcampaign.analysis.detection.power import (
    detectable_change,
    noncentrality,
    null_of,
    p_two_sided,
    per_test_level,
    robust_reference,
    runs_needed,
    t_quantile,
    trials_needed,
)
from mlcampaign.analysis.detection.run_values import (
    MeasuredRuns,
    Noise,
    RunSeries,
    as_cv,
    as_relative,
    centre_variance_factor,
    huber_centres,
    noise_of,
    run_series,
    within_sds,
)
from mlcampaign.analysis.detection.settings import ALARMS, DEFAULT_SETTINGS, DetectionSettings, Direction, verdict_of


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


def scan(series: RunSeries, direction: Direction, settings: DetectionSettings = DEFAULT_SETTINGS) -> list[StepResult]:
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
    candidates = _candidate_tests(values, available, settings)
    # The noise of each newest run's reference window (the runs before it, up to ``window``).
    before = inside & (offsets[None, :] < 0) & (offsets[None, :] >= -reference_now[:, None])
    within, within_dof, factor, typical = _reference_noise(n, variance, before, settings)
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
        noise = noise_of(
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


def _candidate_tests(values: np.ndarray, available: np.ndarray, settings: DetectionSettings) -> list[dict]:
    """The candidate tests of every analysis at once (``values``: a row of run values per analysis, the
    newest run last; ``available``: its earlier runs in reach): for k = 1 .. confirmation + 1, the newest
    k runs against the up to ``window`` runs before them, with the reference runs in reach (``size``)
    and used (``used``: an outlying one left out), the difference, its standard error, degrees of
    freedom and p, and the reference level."""
    window, span = settings.window, values.shape[1]
    candidates = []
    for k in range(1, settings.confirmation + 2):
        size = np.minimum(window, available - k + 1)
        reference = values[:, span - k - window : span - k]
        count, level, reference_squares = robust_reference(reference, settings.reference_outlier_alpha)
        new = values[:, span - k :]
        new_mean = new.mean(axis=1)
        squares = reference_squares + ((new - new_mean[:, None]) ** 2).sum(axis=1)
        df = count + k - 2
        with np.errstate(divide="ignore", invalid="ignore"):
            se = np.sqrt(squares / df * (1 / count + 1 / k))
            diff = new_mean - level
            t = np.where(se > 0, diff / se, np.where(diff == 0, 0.0, np.copysign(np.inf, diff)))
        p = p_two_sided(t, df)
        candidates.append(
            {"k": k, "size": size, "used": count, "diff": diff, "se": se, "df": df, "p": p, "level": level}
            | {"reference_squares": reference_squares}
        )
    return candidates


def _reference_noise(
    n: np.ndarray, variance: np.ndarray, before: np.ndarray, settings: DetectionSettings
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per analysis, from the runs of its newest run's reference window (``before``; ``n`` trials and
    their ``variance`` per run): the pooled within-run sd and its degrees of freedom, the mean variance
    factor of the reference runs' values, and their median trials."""
    within, within_dof = within_sds(np.where(before, n, 0), np.where(before, variance, np.nan))
    table = np.array([np.nan, *(centre_variance_factor(trials, settings.huber_k) for trials in range(1, n.max() + 1))])
    reference_n = np.where(before, n, 0)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # analyses without reference runs: NaN, not used
        factor = np.nanmean(np.where(before, table[reference_n], np.nan), axis=1)
        typical = np.nanmedian(np.where(before, n, np.nan), axis=1)
    return within, within_dof, factor, typical


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
        return _tested(best, verdict_of(best["diff"], direction), None, settings, context)
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
    half = t_quantile(float(test["df"]), level / 2) * float(test["se"])
    diff = float(test["diff"])
    relative, low, high = (
        as_relative(value, float(test["level"]), settings.scale) for value in (diff, diff - half, diff + half)
    )
    null = null_of(context["sizes"], settings)
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
            f"fewer noisy weeks: the between-run noise ({as_cv(noise.between_sd, settings.scale):.1%}) alone exceeds "
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
        return _undecided(run, "cannot tell yet", "insufficient history", detail, settings)
    runs = MeasuredRuns.of(series, 0, run + 1, settings.huber_k)
    if not len(runs.value) or runs.position[-1] != run:
        return _undecided(run, "not measured", None, "no value of the cell in this run", settings)
    baseline = reference_centre(series, reference, settings)
    if math.isnan(baseline):
        return _undecided(run, "cannot tell yet", "insufficient history", "the baseline has no value of it", settings)
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
    scale = MeasuredRuns.of(series, 0, len(series.values), settings.huber_k).scale
    return float(huber_centres(values, scale, settings.huber_k)[0])
