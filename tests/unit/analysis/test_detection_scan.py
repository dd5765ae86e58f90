"""The per-run test of mlcampaign.analysis.detection.scan: its verdicts on simulated weekly histories (the
first runs, a step, the better direction, runs that cannot decide alone, an underpowered cell), the noise it
reports, and the accepted baseline as a reference run."""

import numpy as np
import pytest
from cell_histories import SETTINGS, history, scanned, verdicts

from mlcampaign.analysis import detection


def test_the_first_runs_have_insufficient_history_and_say_how_many_runs_they_need():
    first = verdicts(history(0.01, 0.0))[:3]
    assert [(r.verdict, r.reason, r.runs_needed) for r in first] == [
        ("cannot tell yet", "insufficient history", needed) for needed in (3, 2, 1)
    ]


def test_a_step_is_named_at_the_first_changed_run_with_its_size_and_interval():
    alarm = next(r for r in verdicts(history(0.01, 0.05)) if r.verdict == "regression")
    assert (alarm.run, alarm.change_start) == (10, 10)
    assert alarm.ci_low < alarm.relative_change < alarm.ci_high < 0
    assert -0.07 < alarm.relative_change < -0.03
    assert alarm.adjusted_p <= SETTINGS.false_alarm_rate and alarm.false_alarm_rate == 0.01


def test_lower_is_better_turns_a_rise_into_a_regression():
    result = scanned(history(0.01, -0.05), "lower")
    assert {change.direction_verdict for change in result.changes} == {"regression"}
    # Listed at the first changed run (a minor shift while its interval still reaches below min_change),
    # a regression that matters by the next.
    assert result.steps[10].verdict in ("regression", "minor shift") and result.steps[11].verdict == "regression"


def test_a_run_with_two_slow_trials_of_three_cannot_decide_alone():
    trials = history(0.01, 0.0)
    trials[15] = np.array([1000.0, 1000 / 1.15, 1000 / 1.15])
    result = verdicts(trials)[15]
    assert (result.verdict, result.reason) == ("cannot tell yet", "inconsistent trials")


def test_a_run_without_values_is_not_measured_and_skipped():
    trials = history(0.01, 0.05)
    trials[9] = None
    results = verdicts(trials)
    assert results[9].verdict == "not measured"
    assert results[10].verdict in ("regression", "minor shift") and results[10].change_start == 10


def test_a_noisy_cell_says_it_cannot_detect_the_target_change_and_what_it_needs():
    result = verdicts(history(0.05, 0.0, seed=2))[-1]
    assert (result.verdict, result.reason) == ("cannot tell yet", "underpowered")
    assert "cannot detect a 5% change yet" in result.detail
    assert result.mde_confirmed > 0.05 and result.trials_needed > 3


def test_the_noise_separates_within_run_and_week_level_variation():
    rng = np.random.default_rng(1)
    trials = [1000 * (1 + 0.02 * rng.standard_normal()) * (1 + 0.01 * rng.standard_normal(5)) for _ in range(53)]
    noise = verdicts(trials, settings=detection.DetectionSettings(window=52))[-1].noise
    assert noise.runs == 52 and noise.within_sd == pytest.approx(0.01, rel=0.15)
    assert noise.between_sd == pytest.approx(0.02, rel=0.25) and noise.between_p < 0.001


def test_the_baseline_is_a_reference_run_judged_against_the_run_to_run_noise():
    trials = history(0.01, 0.0, runs=12)
    noise = verdicts(trials)[-1].noise
    series = detection.run_series(trials)
    same = detection.reference_test(series, 1000 * (1 + 0.01 * np.array([0.3, -0.2, 0.1])), noise, "higher")
    assert same.verdict == "unchanged"
    faster = detection.reference_test(series, [1100.0, 1101.0, 1099.0], noise, "higher")
    assert faster.verdict == "regression" and faster.relative_change == pytest.approx(1000 / 1100 - 1, abs=0.02)
    early = detection.reference_test(
        detection.run_series(trials[:2]), [1000.0], verdicts(trials[:2])[-1].noise, "higher"
    )
    assert (early.verdict, early.reason) == ("cannot tell yet", "insufficient history")
