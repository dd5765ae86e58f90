"""Calibration and power of the per-run test (mlcampaign.analysis.detection.power): the calibrated level's
false-alarm rate on fresh draws, the robust reference it shares with the test, and the trials a cell needs."""

import numpy as np
import pytest

from mlcampaign.analysis import detection
from mlcampaign.analysis.detection.power import _null_min_p, structure_of
from mlcampaign.analysis.detection.statistic import segmented_reference
from mlcampaign.analysis.detection.steps import underpowered_text

SETTINGS = detection.DetectionSettings()


@pytest.mark.parametrize(
    "references",
    [
        (12, 12, 12, 12),
        ((11, 1),),  # the run after a change: the level of one run, the noise pooled over two segments
        ((8, 4), (9, 3), (10, 2), (11, 1)),
        ((2, 6, 4), (3, 6, 3), (4, 6, 2), (5, 6, 1)),
    ],
)
def test_the_calibrated_level_gives_the_per_run_tests_rate_on_fresh_draws(references):
    """The per-run test's share of false_alarm_rate, for one segment and for noise pooled over several."""
    level = detection.per_test_level(references, SETTINGS)
    fresh = _null_min_p(structure_of(references), SETTINGS.reference_outlier_alpha, 40_000, seed=12345)
    assert abs(float(np.mean(fresh <= level)) - SETTINGS.per_run_rate) < 0.0015


def _robust_reference(matrix, alpha):
    reference = segmented_reference(matrix, np.zeros((1, matrix.shape[1]), dtype=int), alpha)
    return reference.used, reference.level, reference.squares


def test_the_robust_reference_of_a_shorter_window_is_that_of_its_runs_alone():
    """The per-run test and its calibration share segmented_reference: a row with fewer runs (NaN-padded,
    as early in a segment) gives what its runs alone give; one far run of ten is left out."""
    rng = np.random.default_rng(3)
    matrix = rng.standard_normal((500, 10))
    matrix[::5, 2] += 9
    padded = matrix.copy()
    padded[:, :4] = np.nan  # six runs each
    count, mean, squares = _robust_reference(padded, 0.01)
    alone = _robust_reference(matrix[:, 4:], 0.01)
    np.testing.assert_allclose(np.column_stack([count, mean, squares]), np.column_stack(alone), atol=1e-12)
    full_count, _, _ = _robust_reference(matrix, 0.01)
    assert (full_count[::5] == 9).mean() > 0.9 and (full_count[1::5] == 10).mean() > 0.95


def test_trials_cannot_help_against_week_level_noise():
    noisy = detection.Noise(12, 3, within_sd=0.03, run_sd=0.04, run_df=11, between_sd=0.035, between_p=0.001)
    assert detection.trials_needed(noisy, SETTINGS) is None
    result = underpowered_text(0.12, None, None, noisy, SETTINGS)
    assert "between-run noise (3.6%) alone exceeds what 12 runs resolve" in result
    quiet = detection.Noise(12, 3, within_sd=0.03, run_sd=0.018, run_df=11, between_sd=0.0, between_p=0.5)
    assert 3 < detection.trials_needed(quiet, SETTINGS) < 10


def test_the_noise_is_pooled_over_the_segments_and_the_level_is_the_last_ones():
    """After a change the reference runs fall into segments: each run deviates from its own segment's
    mean (degrees of freedom: runs - segments), the level is the newest segment's mean."""
    reference = segmented_reference(np.array([[1.0, 2.0, 3.0, 10.0, 12.0]]), np.array([[0, 0, 0, 1, 1]]), 0.0)
    assert (reference.level[0], reference.level_runs[0], reference.used[0]) == (11.0, 2, 5)
    assert (reference.squares[0], reference.df[0]) == (pytest.approx(4.0), 3)
