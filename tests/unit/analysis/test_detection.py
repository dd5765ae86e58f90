"""The change detectors of mlcampaign.analysis.detection: calibration, verdicts, the libraries' public
series (the change points their own tests expect), and the convergence threshold against rcp_checker's."""

import math

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from mlcampaign.analysis import detection, regression
from mlcampaign.cli import EXIT_CANNOT_TELL, EXIT_FAILED_TRIALS, EXIT_REGRESSION

from conftest import REPO

CHANGEPOINTS = REPO.parent / "shared" / "data" / "changepoints"  # ../shared beside the checkout
SETTINGS = detection.DetectionSettings()


def history(cv: float, step: float, runs: int = 20, trials: int = 3, seed: int = 0) -> list[np.ndarray]:
    """Throughput around 1000 with a step of ``step`` (relative, down) from run 10."""
    rng = np.random.default_rng(seed)
    return [1000 * (1 - step * (run >= 10)) * (1 + cv * rng.standard_normal(trials)) for run in range(runs)]


def verdicts(trials, direction="higher", settings=SETTINGS) -> list[detection.StepResult]:
    return detection.scan(detection.run_series(trials), direction, settings)


def test_the_calibrated_level_gives_the_stated_false_alarm_rate_on_fresh_draws():
    sizes = (12, 12, 12, 12)
    level = detection.per_test_level(sizes, SETTINGS)
    fresh = detection._null_min_p(sizes, SETTINGS.reference_outlier_alpha, 40_000, seed=12345)
    assert abs(float(np.mean(fresh <= level)) - SETTINGS.false_alarm_rate) < 0.002


def test_the_robust_reference_of_a_shorter_window_is_that_of_its_runs_alone():
    """The per-run test and its calibration share _robust_reference: a row with fewer runs (NaN-padded, as
    early in a segment) gives what its runs alone give; one far run of ten is left out."""
    rng = np.random.default_rng(3)
    matrix = rng.standard_normal((500, 10))
    matrix[::5, 2] += 9
    padded = matrix.copy()
    padded[:, :4] = np.nan  # six runs each
    count, mean, squares = detection._robust_reference(padded, 0.01)
    alone = detection._robust_reference(matrix[:, 4:], 0.01)
    np.testing.assert_allclose(np.column_stack([count, mean, squares]), np.column_stack(alone), atol=1e-12)
    full_count, _, _ = detection._robust_reference(matrix, 0.01)
    assert (full_count[::5] == 9).mean() > 0.9 and (full_count[1::5] == 10).mean() > 0.95


def test_the_huber_centre_is_the_mean_of_agreeing_trials_and_resists_one_slow_trial():
    agreeing = np.array([[0.0, 0.5, 1.0]])
    assert detection.huber_centres(agreeing, 1.0, 1.345)[0] == pytest.approx(0.5)
    slow = np.array([[0.0, 0.1, -8.0]])  # one trial 8 within-run sds slower
    centre = detection.huber_centres(slow, 1.0, 1.345)[0]
    assert -0.7 < centre < 0.0 and np.mean(slow) < -2.5
    assert detection.huber_centres(slow, math.nan, 1.345)[0] == pytest.approx(0.0)  # no scale: the median
    # As efficient as the mean (1/3), far better than the median of 3 (0.449).
    assert detection.centre_variance_factor(3, 1.345) < 0.36


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
    assert verdicts(history(0.01, -0.05), "lower")[10].verdict == "regression"


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
    assert results[10].verdict == "regression"


def test_a_noisy_cell_says_it_cannot_detect_the_target_change_and_what_it_needs():
    result = verdicts(history(0.05, 0.0, seed=2))[-1]
    assert (result.verdict, result.reason) == ("cannot tell yet", "underpowered")
    assert "cannot detect a 5% change yet" in result.detail
    assert result.mde_confirmed > 0.05 and result.trials_needed > 3


def test_trials_cannot_help_against_week_level_noise():
    noisy = detection.Noise(12, 3, within_sd=0.03, run_sd=0.04, run_df=11, between_sd=0.035, between_p=0.001)
    assert detection.trials_needed(noisy, SETTINGS) is None
    result = detection._underpowered_text(0.12, None, None, noisy, SETTINGS)
    assert "between-run noise (3.6%) alone exceeds what 12 runs resolve" in result
    quiet = detection.Noise(12, 3, within_sd=0.03, run_sd=0.018, run_df=11, between_sd=0.0, between_p=0.5)
    assert 3 < detection.trials_needed(quiet, SETTINGS) < 10


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


def test_apache_otava_finds_the_change_point_of_its_csv_example():
    """otava is installed without its declared numpy and scipy pins (requirements-nodeps.txt): its
    analysis must still work with the project's numpy and scipy."""
    from otava.analysis import compute_change_points

    metric2 = [10.43, 10.23, 10.29, 10.91, 10.34, 10.69, 9.23, 9.11, 9.13, 9.03]  # its tests/csv_e2e_test.py
    points, _ = compute_change_points(metric2)
    assert [int(point.index) for point in points] == [6]
    assert points[0].stats.mean_2 / points[0].stats.mean_1 - 1 == pytest.approx(-0.129, abs=0.001)


@pytest.mark.parametrize(
    ("name", "column", "expected"),
    [
        ("otava-sample.csv", "metric1", []),
        ("otava-sample.csv", "metric2", [6]),
        ("otava-sample_single_branch.csv", "metric1", []),
        ("otava-sample_single_branch.csv", "metric2", []),
    ],
)
def test_apache_otavas_public_series_give_the_change_points_its_tests_expect(name, column, expected):
    values = pd.read_csv(CHANGEPOINTS / name)[column].to_numpy(float)
    changes = detection.history_changes(detection.run_series([[value] for value in values]), "higher")
    assert [change.run for change in changes] == expected


def test_mongodbs_long_series_has_the_four_change_points_its_test_counts():
    values = np.asarray(pd.read_json(CHANGEPOINTS / "mongodb-long_series.json")[0], float)
    series = detection.run_series([[value] for value in values], "linear")
    settings = detection.DetectionSettings(scale="linear")
    found = detection._change_points(detection.run_values(series, settings)[~np.isnan(values)], settings)
    assert sorted(found) == [205, 395, 594, 794]


def test_the_history_names_a_missed_change_later_and_when_it_was_first_found():
    trials = history(0.03, 0.08, seed=5)
    (change,) = detection.history_changes(detection.run_series(trials), "higher")
    assert change.run == 10 and change.verdict == "regression" and 11 <= change.first_found <= 19
    assert change.after / change.before - 1 == pytest.approx(change.relative_change)


def test_one_outlying_run_is_not_a_history_change():
    trials = history(0.01, 0.0)
    trials[12] = trials[12] / 1.15
    assert detection.history_changes(detection.run_series(trials), "higher") == []


def test_the_convergence_threshold_is_rcp_checkers_mirrored_with_the_run_as_the_unit():
    runs = [np.array([19.0, 19.5 + (run % 2), 22.0]) for run in range(10)]  # olympic means 19.5 / 20.5
    settings = detection.DetectionSettings(false_alarm_rate=0.05, scale="linear")
    result = detection.convergence_test(runs, [20.0, 20.5, 21.0], settings)
    means = np.array([19.5 + (run % 2) for run in range(10)])
    # No trial missed the target: the epochs test has the whole false-alarm rate (else half of it).
    expected = means.mean() + scipy.stats.t.isf(0.05, 9) * means.std(ddof=1) * math.sqrt(1 + 1 / 10)
    assert result.max_acceptable == pytest.approx(expected)
    assert detection.convergence_test(runs, [22.0, 22.5, 23.0], settings).verdict == "regression"
    assert detection.convergence_test(runs, [15.0, 15.5, 16.0], settings).verdict == "unchanged"  # one-sided


def test_convergence_of_a_deterministic_history_uses_the_evaluation_grid():
    runs = [np.array([8.0, 8.0, 8.0]) for _ in range(10)]  # same seeds, deterministic training
    assert detection.convergence_test(runs, [8.0, 8.0, 8.0], SETTINGS, resolution=1.0).verdict == "unchanged"
    assert detection.convergence_test(runs, [9.0, 9.0, 10.0], SETTINGS, resolution=1.0).verdict == "regression"


def test_missed_targets_are_a_convergence_regression_only_beyond_the_historys_misses():
    never = [np.array([np.nan, np.nan, np.nan])] * 5
    assert detection.convergence_test(never, [np.nan] * 3).verdict == "no value"
    reached = [np.array([8.0, 9.0, 8.0])] * 5
    assert detection.convergence_test(reached, [np.nan] * 3).verdict == "regression"  # Fisher p = 1/816
    often_missed = [np.array([8.0, np.nan, 9.0]), np.array([np.nan, 8.0, 8.0])] * 3
    result = detection.convergence_test(often_missed, [np.nan, np.nan, 8.0])
    assert result.verdict == "unchanged" and "2 of 3 trial(s) missed the target, 6 of 18 before" in result.detail


def test_every_verdict_reason_and_exit_status_is_documented():
    documented = (REPO / "docs" / "regression.md").read_text()
    for name in [*detection.VERDICTS, *detection.REASONS, *regression.VERDICTS]:
        assert f"`{name}`" in documented, name
    for status in (EXIT_REGRESSION, EXIT_FAILED_TRIALS, EXIT_CANNOT_TELL):
        assert f" {status} " in documented.split("**Exit status of `mlcampaign summary`**")[1].split("\n\n")[0]
