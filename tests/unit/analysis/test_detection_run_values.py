"""Run values (mlcampaign.analysis.detection.run_values): the Huber centre of a run's trials."""

import math

import numpy as np
import pytest

from mlcampaign.analysis import detection


def test_the_huber_centre_is_the_mean_of_agreeing_trials_and_resists_one_slow_trial():
    agreeing = np.array([[0.0, 0.5, 1.0]])
    assert detection.huber_centres(agreeing, 1.0, 1.345)[0] == pytest.approx(0.5)
    slow = np.array([[0.0, 0.1, -8.0]])  # one trial 8 within-run sds slower
    centre = detection.huber_centres(slow, 1.0, 1.345)[0]
    assert -0.7 < centre < 0.0 and np.mean(slow) < -2.5
    assert detection.huber_centres(slow, math.nan, 1.345)[0] == pytest.approx(0.0)  # no scale: the median
    # As efficient as the mean (1/3), far better than the median of 3 (0.449).
    assert detection.centre_variance_factor(3, 1.345) < 0.36
