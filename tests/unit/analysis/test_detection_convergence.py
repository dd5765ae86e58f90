"""Epochs to target (mlcampaign.analysis.detection.convergence): the threshold against rcp_checker's, a
deterministic history, and missed targets."""

import math

import numpy as np
import pytest
import scipy.stats

from mlcampaign.analysis import detection

SETTINGS = detection.DetectionSettings()


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
